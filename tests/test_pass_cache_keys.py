"""Every pass's ``uuid()`` covers the source of what it inlines or calls: in a copy of the
package, editing one helper changes the uuid; the unedited copy keeps it."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dspark_compile"
HAS_VLLM = importlib.util.find_spec("vllm") is not None

UUIDS = """
import json
from dspark_compile.config import DraftWindowConfig
from dspark_compile.passes import DraftWindowPass, DSparkNonCausalIndexPass
config = DraftWindowConfig(draft_window_size=64, method="dspark")
uuids = {"draft_window": DraftWindowPass(config).uuid(),
         "dspark_noncausal": DSparkNonCausalIndexPass(config).uuid()}
if VLLM:
    from dspark_compile.integrations.vllm import DraftWindowInductorPass
    uuids["vllm"] = DraftWindowInductorPass(draft_window_size=64, method="dflash").uuid()
print(json.dumps(uuids))
"""


def _uuids(root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    script = UUIDS.replace("VLLM", str(HAS_VLLM))
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _copy(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(PACKAGE, root / "dspark_compile", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _edit(root: Path, relative: str, old: str, new: str) -> None:
    path = root / "dspark_compile" / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} not found once in {relative}"
    path.write_text(text.replace(old, new))


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return _uuids(_copy(tmp_path_factory.mktemp("original"), "pkg"))


def test_the_unedited_copy_keeps_every_uuid(original):
    assert _uuids(PACKAGE.parent) == original


@pytest.mark.parametrize(
    "relative,old,new",
    [
        # a module-level helper the window pass inlines into the graph
        (
            "passes/draft_window.py",
            "        return window.window_seq_lens_and_block_table_packed",
            "        return window.window_seq_lens_and_block_table",
        ),
        # the window arithmetic the inserted code calls
        (
            "arithmetic/window.py",
            "def sink_blocks(",
            "def _unused():\n    pass\n\n\ndef sink_blocks(",
        ),
    ],
)
def test_editing_a_helper_changes_every_uuid(tmp_path, original, relative, old, new):
    root = _copy(tmp_path, "edited")
    _edit(root, relative, old, new)
    edited = _uuids(root)
    assert edited.keys() == original.keys()
    assert all(edited[name] != original[name] for name in original), (edited, original)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the [vllm] extra)")
@pytest.mark.parametrize(
    "module",
    # the route's modules after the split of metadata.py (issue 39), and the seam
    ["config.py", "seam.py", "backends.py", "token_window.py", "sink_window.py", "step_windows.py"],
)
def test_editing_the_vllm_integration_changes_only_the_vllm_uuid(tmp_path, original, module):
    root = _copy(tmp_path, "edited")
    path = root / "dspark_compile" / "integrations" / "vllm" / module
    path.write_text(path.read_text() + "\n# edited\n")
    edited = _uuids(root)
    assert edited["vllm"] != original["vllm"]
    assert {k: v for k, v in edited.items() if k != "vllm"} == {
        k: v for k, v in original.items() if k != "vllm"
    }


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the [vllm] extra)")
def test_the_vllm_uuid_covers_the_vllm_version(monkeypatch):
    import vllm

    from dspark_compile.integrations.vllm import DraftWindowInductorPass

    graph_pass = DraftWindowInductorPass(draft_window_size=64, method="dflash")
    before = graph_pass.uuid()
    monkeypatch.setattr(vllm, "__version__", vllm.__version__ + ".edited")
    assert graph_pass.uuid() != before
