"""Results metadata: the checkout's exact tree (commit, and the diff's hash when dirty)
beside date, device and versions."""

import subprocess

from dspark_research.provenance import CHECKOUT, git_state, provenance


def _git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    )


def test_provenance_names_the_checkouts_commit():
    head = subprocess.run(
        ["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    meta = provenance()
    assert {"date", "device", "python", "torch", "triton", "commit", "dirty", "tree"} <= set(meta)
    if head.returncode == 0:
        assert meta["commit"] == head.stdout.strip() and isinstance(meta["dirty"], bool)


def test_a_dirty_tree_is_named_by_its_diff_and_a_clean_one_by_its_commit(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    clean = git_state(tmp_path)
    assert clean["tree"] == clean["commit"] and not clean["dirty"] and clean["diff"] is None
    (tmp_path / "a.py").write_text("x = 2\n")
    one = git_state(tmp_path)
    (tmp_path / "a.py").write_text("x = 3\n")
    other = git_state(tmp_path)
    assert one["dirty"] and "-dirty" not in one["tree"]
    assert one["tree"].startswith(clean["commit"] + "+diff.")
    # negative control: a different change gives a different name (a bare flag would not)
    assert one["tree"] != other["tree"]


def test_outside_a_git_work_tree_everything_is_none(tmp_path):
    assert set(git_state(tmp_path).values()) == {None}
