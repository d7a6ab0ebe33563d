"""Cache keys over source files: a pass's ``uuid()`` must change whenever code it inlines
into the graph or calls changes, or Inductor's FX-graph cache serves a stale graph."""

from __future__ import annotations

import functools
from pathlib import Path

from torch._inductor.custom_graph_pass import get_hash_for_files

PACKAGE_ROOT = Path(__file__).resolve().parents[1]

#: What the graph passes import, inline or call: every ``.py`` file under these parts.
PASS_SOURCES = ("arithmetic", "config.py", "kernels", "ops", "passes", "validation.py")


def source_files(parts: tuple[str, ...]) -> tuple[Path, ...]:
    """The ``.py`` files of ``parts`` (subpackage directories or module files, relative to
    the package root), sorted."""
    files: set[Path] = set()
    for part in parts:
        path = PACKAGE_ROOT / part
        if path.is_dir():
            files.update(path.rglob("*.py"))
        elif path.is_file() and path.suffix == ".py":
            files.add(path)
        else:
            raise ValueError(
                f"parts entry {part!r} is invalid: expected a subpackage "
                f"directory or a .py module under {PACKAGE_ROOT}"
            )
    return tuple(sorted(files))


@functools.cache
def source_hash(parts: tuple[str, ...] = PASS_SOURCES) -> str:
    """Hex sha256 of the contents and package-relative names of ``source_files(parts)``
    (computed once per process: the files do not change under a running interpreter)."""
    files = source_files(parts)
    names = "\n".join(f.relative_to(PACKAGE_ROOT).as_posix() for f in files)
    return get_hash_for_files(tuple(str(f) for f in files), extra=names).hex()
