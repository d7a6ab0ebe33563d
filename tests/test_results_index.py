"""The results index marks a figure stale by itself: ``benchmarks/results/index.json`` names,
per claim of ``benchmarks/results/README.md``, the tree measured and the code the figure
measures; a claim whose code changed after its tree (``git log TREE..HEAD -- CODE``) must
say **stale** in the README, and one whose code did not must say current.

New results files (dated folders from 2026-12-04 on) name the exact tree measured: a
40-hex commit, or ``COMMIT+diff.SHA12`` (never a bare ``-dirty``).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LINK = re.compile(r"\]\((\d{4}-\d\d-\d\d/[^)\s]+)\)")
TREE = re.compile(r"^[0-9a-f]{40}(\+diff\.[0-9a-f]{12})?$")
FIRST_EXACT_DAY = "2026-12-04"


def _git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def changed_after(tree: str, code: list[str], root: Path = ROOT) -> list[str]:
    """Short hashes of the commits after ``tree`` (to HEAD) that touch ``code``."""
    run = _git("log", "--format=%h", f"{tree}..HEAD", "--", *code, root=root)
    if run.returncode != 0:
        raise AssertionError(f"git log {tree}..HEAD failed: {run.stderr.strip()}")
    return run.stdout.split()


def readme_statuses(text: str) -> dict[str, str]:
    """``{first linked results file: the row's last cell}`` of the index's tables."""
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| claim"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        links = LINK.findall(cells[1]) if len(cells) > 1 else []
        if links:
            rows[links[0]] = cells[-1]
    return rows


README_LINK = re.compile(r"\]\(benchmarks/results/(\d{4}-\d\d-\d\d/[^)\s#]+)\)")


def performance_statuses(text: str) -> list[tuple[str, str]]:
    """``(results file, status cell)`` per row of README.md's ``## Performance`` table
    (each row links the results file its figure comes from)."""
    section = text.split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| what"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        links = README_LINK.findall(line)
        rows.append((links[0] if links else f"<no results file: {cells[0]}>", cells[-1]))
    return rows


def status_problems(claims: list[dict], statuses: dict[str, str], root: Path = ROOT) -> list[str]:
    """What is untrue in the index: a row missing, a claim marked current whose code
    changed, or marked stale whose code did not."""
    problems = []
    for claim in claims:
        status = statuses.get(claim["file"])
        if status is None:
            problems.append(f"{claim['file']}: no row of the index links it first")
            continue
        if claim.get("background"):
            continue
        later = changed_after(claim["tree"], claim["code"], root)
        if later and not status.startswith("**stale**"):
            problems.append(
                f"{claim['file']}: marked {status[:40]!r} but {', '.join(later)} changed "
                f"{claim['code']} after {claim['tree']}: mark it **stale** or re-measure"
            )
        if not later and status.startswith("**stale**"):
            problems.append(
                f"{claim['file']}: marked stale, but nothing in {claim['code']} changed "
                f"after {claim['tree']}: it is current"
            )
    return problems


@pytest.fixture(scope="module")
def full_history():
    shallow = _git("rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0:
        pytest.skip("not a git checkout: the index's staleness check needs the history")
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone: the index's staleness check needs the full history")


def test_every_claim_of_the_index_says_whether_its_code_changed(full_history):
    index = json.loads((RESULTS / "index.json").read_text())
    statuses = readme_statuses((RESULTS / "README.md").read_text())
    for claim in index["claims"]:
        assert (RESULTS / claim["file"]).exists(), claim["file"]
    assert set(statuses) == {c["file"] for c in index["claims"]}, (
        "index.json and README.md list different claims"
    )
    assert status_problems(index["claims"], statuses) == []


def test_the_readme_performance_table_says_what_the_index_says(full_history):
    """Each headline figure links a results file of the index, and says stale exactly
    when the index's check does (the same ``git log``)."""
    index = {c["file"]: c for c in json.loads((RESULTS / "index.json").read_text())["claims"]}
    rows = performance_statuses((ROOT / "README.md").read_text())
    assert rows, "README.md's Performance table has no rows"
    unknown = sorted(f for f, _ in rows if f not in index)
    assert unknown == [], f"rows that link no results file of index.json: {unknown}"
    problems = [p for f, status in rows for p in status_problems([index[f]], {f: status})]
    assert problems == []


def test_performance_statuses_reads_each_rows_file_and_status():
    text = (
        "# x\n\n## Performance\n\n| what | figure | status |\n|---|---|---|\n"
        "| a | 1 us ([file](benchmarks/results/2026-12-01/a.md)) | **stale** |\n"
        "| b | 2 us | current |\n\n## Limitations\n"
        "| c | ([f](benchmarks/results/2026-12-02/c.md)) | x |\n"
    )
    assert performance_statuses(text) == [
        ("2026-12-01/a.md", "**stale**"),
        ("<no results file: b>", "current"),
    ]


def test_the_check_catches_a_figure_whose_code_changed(tmp_path):
    """Negative control, on a throwaway repository: code changed after the measured tree
    must be reported while the row says current, and not once it says stale."""

    def git(*args):
        subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    (tmp_path / "other.py").write_text("b = 1\n")
    git("add", ".")
    git("commit", "-qm", "measured")
    tree = _git("rev-parse", "HEAD", root=tmp_path).stdout.strip()
    claims = [{"file": "d/x.md", "tree": tree, "code": ["kernel.py"]}]
    current, stale = {"d/x.md": "current"}, {"d/x.md": "**stale**: later"}
    assert status_problems(claims, current, tmp_path) == []
    (tmp_path / "other.py").write_text("b = 2\n")
    git("commit", "-qam", "unrelated")
    assert status_problems(claims, current, tmp_path) == []
    assert status_problems(claims, stale, tmp_path) != []  # stale without a cause
    (tmp_path / "kernel.py").write_text("a = 2\n")
    git("commit", "-qam", "kernel changed")
    assert "kernel changed" not in str(status_problems(claims, current, tmp_path))
    assert len(status_problems(claims, current, tmp_path)) == 1
    assert status_problems(claims, stale, tmp_path) == []
    assert status_problems(claims, {}, tmp_path) != []  # a claim without a row


def test_new_results_files_name_the_exact_tree_measured():
    bad = []
    for day in sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name >= FIRST_EXACT_DAY):
        for path in day.glob("*.json"):
            text = path.read_text()
            for value in re.findall(r'"(?:git_commit|pair_git_commit|tree)": "([^"]*)"', text):
                if not TREE.match(value):
                    bad.append(f"{path.relative_to(RESULTS)}: {value!r}")
    assert bad == [], "results must name a commit or COMMIT+diff.SHA12: " + "; ".join(bad)
