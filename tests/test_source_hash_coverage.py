"""The compiled-graph cache key covers every source a pass inlines or calls (issue 39,
item 5a), each check with a negative control.

* Statically: every ``dspark_compile`` module that ``passes/`` (and the vLLM pass,
  ``integrations/vllm/``) import, directly or through each other, lazily inside functions
  included, lies in ``source_files(PASS_SOURCES)`` (``VLLM_PASS_SOURCES``). Control: a
  source list without ``kernels``, ``ops``, ``config.py`` or ``validation.py`` is caught.
* Behaviourally, in process: with ``source_hash.PACKAGE_ROOT`` pointed at a copy of the
  package, appending a comment to one file of ``kernels/`` (the one-launch window metadata
  included), ``ops/``, ``config.py``, ``validation.py``, ``arithmetic/`` or ``passes/``
  changes the real passes' ``uuid()``. Control: with that file's part left out of the
  source list the passes hash, the same edit leaves the uuid unchanged, and the check says so.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

import pytest

from dspark_compile.passes import base, source_hash
from dspark_compile.passes.source_hash import PACKAGE_ROOT, PASS_SOURCES, source_files

HAS_VLLM = importlib.util.find_spec("vllm") is not None
#: The parts issue 39 names explicitly; each must be in PASS_SOURCES.
REQUIRED = ("kernels", "ops", "config.py", "validation.py")


def _module_file(name: str) -> Path | None:
    path = PACKAGE_ROOT.joinpath(*name.split(".")[1:])
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return None


def _imports(path: Path) -> set[Path]:
    """Files of the ``dspark_compile`` modules ``path`` imports (anywhere in it)."""
    rel = path.relative_to(PACKAGE_ROOT.parent).with_suffix("")
    package = list(rel.parts[:-1])  # the containing package, for a module or an __init__
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("dspark_compile"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)]
                module = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("dspark_compile"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                names.add(sub if _module_file(sub) else module)
    return {f for f in map(_module_file, names) if f is not None}


def import_closure(parts: tuple[str, ...]) -> set[Path]:
    """Every file of ``parts`` and every package module they import, transitively."""
    todo = list(source_files(parts))
    seen = set(todo)
    while todo:
        for found in _imports(todo.pop()):
            if found not in seen:
                seen.add(found)
                todo.append(found)
    return seen


def uncovered(start: tuple[str, ...], sources: tuple[str, ...]) -> list[str]:
    """Modules reachable from ``start`` whose source a key over ``sources`` would miss."""
    covered = set(source_files(sources))
    return sorted(str(f.relative_to(PACKAGE_ROOT)) for f in import_closure(start) - covered)


def test_the_required_parts_are_hashed():
    assert set(REQUIRED) <= set(PASS_SOURCES)
    files = {f.relative_to(PACKAGE_ROOT).as_posix() for f in source_files(PASS_SOURCES)}
    assert "kernels/window_metadata.py" in files
    assert {"config.py", "validation.py", "ops/paged_attention.py"} <= files


def test_every_module_the_passes_import_is_hashed():
    assert uncovered(("passes",), PASS_SOURCES) == []


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the [vllm] extra)")
def test_every_module_the_vllm_pass_imports_is_hashed():
    from dspark_compile.integrations.vllm.inductor_pass import VLLM_PASS_SOURCES

    assert uncovered(("passes", "integrations/vllm"), VLLM_PASS_SOURCES) == []


@pytest.mark.parametrize("omitted", REQUIRED)
def test_negative_control_a_source_list_missing_a_part_is_caught(omitted):
    sources = tuple(p for p in PASS_SOURCES if p != omitted)
    missing = uncovered(("passes",), sources)
    assert missing and all(m == omitted or m.startswith(omitted + "/") for m in missing), missing


# -- behaviour: the real uuid() over an edited copy -----------------------------------


@pytest.fixture
def copy_root(tmp_path, monkeypatch):
    """A copy of the hashed parts of the package, which ``source_hash`` reads instead."""
    root = tmp_path / "dspark_compile"
    for part in PASS_SOURCES + ("integrations/vllm",):
        src, dst = PACKAGE_ROOT / part, root / part
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    monkeypatch.setattr(source_hash, "PACKAGE_ROOT", root)
    source_hash.source_hash.cache_clear()
    yield root
    source_hash.source_hash.cache_clear()  # later tests hash the real tree again


def _uuids() -> dict[str, str]:
    from dspark_compile.config import DraftWindowConfig
    from dspark_compile.passes import DraftWindowPass, DSparkNonCausalIndexPass

    source_hash.source_hash.cache_clear()
    config = DraftWindowConfig(draft_window_size=64, method="dspark")
    uuids = {
        "draft_window": DraftWindowPass(config).uuid(),
        "dspark_noncausal": DSparkNonCausalIndexPass(config).uuid(),
    }
    if HAS_VLLM:
        from dspark_compile.integrations.vllm import DraftWindowInductorPass

        uuids["vllm"] = DraftWindowInductorPass(draft_window_size=64, method="dflash").uuid()
    return uuids


def edit_changes_every_uuid(root: Path, relative: str) -> bool:
    """Append a comment to ``relative`` in the copy: whether every uuid changed."""
    before = _uuids()
    path = root / relative
    path.write_text(path.read_text() + "\n# edited\n")
    after = _uuids()
    assert before.keys() == after.keys()
    return all(before[k] != after[k] for k in before)


EDITED = [
    "kernels/window_metadata.py",
    "kernels/__init__.py",
    "kernels/paged_attention_triton.py",
    "kernels/paged_attention_launch.py",
    "ops/paged_attention.py",
    "config.py",
    "validation.py",
    "arithmetic/window.py",
    "passes/graph_utils.py",
]


@pytest.mark.parametrize("relative", EDITED)
def test_editing_a_hashed_file_changes_every_uuid(copy_root, relative):
    assert edit_changes_every_uuid(copy_root, relative)


@pytest.mark.parametrize("relative", ["kernels/window_metadata.py", "config.py", "validation.py"])
def test_negative_control_a_key_that_omits_the_file_is_caught(copy_root, monkeypatch, relative):
    """The same check on a key function that leaves the file's part out (the passes'
    ``PASS_SOURCES`` and, for vLLM, its ``VLLM_PASS_SOURCES``): the uuid stays put and the
    check reports it."""
    part = relative.split("/")[0]
    narrowed = tuple(p for p in PASS_SOURCES if p != part)
    monkeypatch.setattr(base, "PASS_SOURCES", narrowed)
    if HAS_VLLM:
        from dspark_compile.integrations.vllm import inductor_pass

        monkeypatch.setattr(inductor_pass, "VLLM_PASS_SOURCES", narrowed + ("integrations/vllm",))
    assert not edit_changes_every_uuid(copy_root, relative)
