"""The training corpus: the running Python's standard library source, as bytes.

Every machine with Python has it, so nothing is downloaded. Files: every
``*.py`` under ``sysconfig.get_paths()["stdlib"]``, excluding ``site-packages``
and ``test``/``tests``/``idle_test`` directories (large, repetitive test data),
sorted by relative path. The split is deterministic: a file is held out for
evaluation when ``sha256(relative path)`` ends in a byte ``< 256 * eval_fraction``,
so it does not depend on the file order or on which other files exist.
Files are joined with a ``\\0`` byte (never in the source) between them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import sysconfig
from pathlib import Path
from typing import Optional

import torch

EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__"})
SEPARATOR = 0


@dataclasses.dataclass
class Corpus:
    """``train``/``eval``: uint8 byte tensors; ``*_files``: their relative paths."""

    root: str
    python_version: str
    train: torch.Tensor
    eval: torch.Tensor
    train_files: list[str]
    eval_files: list[str]

    def manifest(self) -> dict:
        return {
            "root": self.root,
            "python_version": self.python_version,
            "train_bytes": int(self.train.numel()),
            "eval_bytes": int(self.eval.numel()),
            "train_files": len(self.train_files),
            "eval_files": self.eval_files,
            "rule": "*.py under the stdlib, minus site-packages/test/tests/idle_test; "
            "held out when sha256(relative path)[-1] < 256 * eval_fraction",
        }


def stdlib_files(root: Optional[str] = None) -> list[Path]:
    base = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(
        (
            p
            for p in base.rglob("*.py")
            if not EXCLUDED_DIRS.intersection(p.relative_to(base).parts[:-1])
        ),
        key=lambda p: p.relative_to(base).as_posix(),
    )


def is_held_out(relative_path: str, eval_fraction: float) -> bool:
    return hashlib.sha256(relative_path.encode()).digest()[-1] < 256 * eval_fraction


def load_corpus(
    eval_fraction: float = 0.05, max_bytes: Optional[int] = None, root: Optional[str] = None
) -> Corpus:
    """Read the stdlib corpus. ``max_bytes`` caps the training bytes (files in
    sorted order until the cap; the held-out set is never capped below 1 file)."""
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction={eval_fraction!r} is invalid: expected 0 < x < 1")
    base = Path(root or sysconfig.get_paths()["stdlib"])
    train: list[bytes] = []
    held: list[bytes] = []
    train_files: list[str] = []
    eval_files: list[str] = []
    train_size = 0
    for path in stdlib_files(str(base)):
        rel = path.relative_to(base).as_posix()
        data = path.read_bytes().replace(b"\0", b"")
        if is_held_out(rel, eval_fraction):
            held.append(data)
            eval_files.append(rel)
        elif max_bytes is None or train_size < max_bytes:
            train.append(data)
            train_files.append(rel)
            train_size += len(data) + 1
    if not train or not held:
        raise ValueError(
            f"the stdlib at {base} gave {len(train)} training and {len(held)} "
            "held-out files: expected at least one of each"
        )

    def join(parts: list[bytes]) -> torch.Tensor:
        blob = bytes([SEPARATOR]).join(parts)
        return torch.frombuffer(bytearray(blob), dtype=torch.uint8).clone()

    return Corpus(
        str(base), sys.version.split()[0], join(train), join(held), train_files, eval_files
    )


def random_windows(
    data: torch.Tensor, batch: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """``[batch, length + 1]`` int64 windows at random offsets (inputs + next-byte labels)."""
    if data.numel() <= length + 1:
        raise ValueError(f"length={length} is invalid: the data has only {data.numel()} bytes")
    starts = torch.randint(0, data.numel() - length - 1, (batch,), generator=generator)
    index = starts[:, None] + torch.arange(length + 1)
    return data[index].long()
