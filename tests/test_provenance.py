"""Results metadata: the checkout's commit and dirty flag beside date, device and versions."""

import subprocess

from dspark_compile.tools.provenance import CHECKOUT, git_state, provenance


def test_provenance_names_the_checkouts_commit():
    head = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    meta = provenance()
    assert {"date", "device", "python", "torch", "cuda", "triton", "commit", "dirty"} <= set(meta)
    if head.returncode == 0:
        assert meta["commit"] == head.stdout.strip() and isinstance(meta["dirty"], bool)


def test_outside_a_git_work_tree_commit_and_dirty_are_none(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
