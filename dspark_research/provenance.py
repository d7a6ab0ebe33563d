"""Where a result came from: date, device, versions and the git commit of the checkout.

Every results writer (``benchmarks/*.py``) stores ``provenance()`` beside its figures.
"""

from __future__ import annotations

import datetime
import hashlib
import platform
import subprocess
from pathlib import Path

import torch

#: The source checkout this package lives in (dspark_research is never installed).
CHECKOUT = Path(__file__).resolve().parents[1]


def _git(*args: str, root: Path) -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def git_state(root: Path = CHECKOUT) -> dict:
    """``{"commit": HEAD's hash, "dirty": whether tracked files differ from it, "diff":
    sha256 of ``git diff HEAD`` when dirty (else None), "tree": the commit, or
    ``COMMIT+diff.SHA12`` when dirty}``: the exact code measured. All None when ``root``
    is not in a git work tree (or git is missing)."""
    commit = _git("rev-parse", "HEAD", root=root)
    status = _git("status", "--porcelain", "--untracked-files=no", root=root)
    if commit is None or status is None:
        return {"commit": None, "dirty": None, "diff": None, "tree": None}
    commit, dirty = commit.strip(), bool(status.strip())
    diff = None
    if dirty:
        diff = hashlib.sha256((_git("diff", "HEAD", root=root) or "").encode()).hexdigest()
    tree = f"{commit}+diff.{diff[:12]}" if diff else commit
    return {"commit": commit, "dirty": dirty, "diff": diff, "tree": tree}


def provenance(root: Path = CHECKOUT) -> dict:
    """Date (UTC, ISO 8601 to the second), device, Python/torch/CUDA/Triton versions
    (``triton`` None when it is not installed) and ``git_state(root)``."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        **git_state(root),
    }
