"""The one seam to vLLM (``integrations/vllm/seam.py``, issue 39 item 2).

* No module of the package but the seam imports vLLM (an AST check over the source,
  lazy imports in functions and ``importlib.import_module("vllm...")`` included);
  control: a file that does import one is flagged.
* A missing hook point gives an error naming the vLLM version, what is missing and the
  versions it was checked against (the V1 runner made unimportable, as on vLLM 0.34).
* The compile context can be injected (``override_compile_context``) and is resolved
  once per compile (a real Dynamo + Inductor compile, stack walks counted); control:
  without a Dynamo compile id every call walks the stack.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")

from torch._higher_order_ops.auto_functionalize import auto_functionalized
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

from dspark_compile.integrations.vllm import DraftWindowInductorPass, compile_context, seam
from dspark_compile.integrations.vllm.compile_context import (
    CompileContext,
    override_compile_context,
    resolve_compile_context,
)
from dspark_compile.passes.source_hash import PACKAGE_ROOT
from tests.test_vllm_pass import DRAFT_TRITON, make_layers, one_call_graph
from tests.vllm_helpers import cpu_vllm_config

SEAM = PACKAGE_ROOT / "integrations" / "vllm" / "seam.py"
PACKAGES = (PACKAGE_ROOT, PACKAGE_ROOT.parent / "dspark_compile_vllm")


def _is_vllm(module: str | None) -> bool:
    return module is not None and (module == "vllm" or module.startswith("vllm."))


def vllm_imports(path: Path) -> list[str]:
    """``"line: module"`` for every vLLM module ``path`` imports, anywhere in the file:
    ``import vllm...``, ``from vllm... import``, ``from vllm import _x`` and
    ``importlib.import_module`` / ``__import__`` of a literal ``"vllm..."``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: {a.name}" for a in node.names if _is_vllm(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_vllm(node.module):
            found.append(f"{node.lineno}: {node.module}")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arg = node.args[0]
            if (
                name in ("import_module", "__import__")
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and _is_vllm(arg.value)
            ):
                found.append(f"{node.lineno}: {arg.value}")
    return found


def outside_the_seam(roots: tuple[Path, ...], seam_file: Path) -> dict[str, list[str]]:
    """vLLM imports of every ``.py`` file under ``roots`` except ``seam_file``."""
    hits = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.resolve() == seam_file.resolve():
                continue
            imports = vllm_imports(path)
            if imports:
                hits[str(path)] = imports
    return hits


def test_only_the_seam_imports_vllm():
    assert outside_the_seam(PACKAGES, SEAM) == {}
    assert vllm_imports(SEAM)  # the check sees the seam's own imports


@pytest.mark.parametrize(
    "source",
    [
        "import vllm.envs as envs\n",
        "def f():\n    from vllm.v1.worker.gpu_model_runner import GPUModelRunner\n",
        "from vllm import _custom_ops as ops\n",
        "import importlib\nm = importlib.import_module('vllm.v1.kv_cache_interface')\n",
    ],
)
def test_negative_control_a_module_that_imports_vllm_is_flagged(tmp_path, source):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "fine.py").write_text("import torch\nfrom dspark_compile import config\n")
    (package / "bad.py").write_text(source)
    hits = outside_the_seam((package,), SEAM)
    assert list(hits) == [str(package / "bad.py")]


def test_every_hook_point_exists_in_this_vllm():
    version = seam.vllm_version()
    for name in seam.HOOKS:
        if name == "v1_gpu_model_runner" and version.startswith("0.34."):
            assert not seam.probe(name)  # removed in 0.34
            continue
        assert seam.probe(name), name
        seam.require(name)


def test_a_missing_hook_point_names_the_version_and_what_is_missing(monkeypatch):
    """The V1 runner module made unimportable (as vLLM 0.34 removed it)."""
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", None)
    assert not seam.probe("v1_gpu_model_runner")
    with pytest.raises(RuntimeError) as error:
        seam.require("v1_gpu_model_runner")
    message = str(error.value)
    assert f"vLLM {seam.vllm_version()} lacks GPUModelRunner.get_kv_cache_spec" in message
    assert "vllm/v1/worker/gpu_model_runner.py" in message
    assert "checked against vLLM 0.26.0, 0.32.0, 0.33.0 (removed in 0.34.0)" in message
    assert "v1_gpu_model_runner" not in [hook for hook, _ in seam.model_runner_classes()]
    with pytest.raises(KeyError):
        seam.probe("no_such_hook")


def test_layer_name_read_by_position_and_by_keyword():
    """A direct (not functionalized) call: ``layer_name`` is argument 4 of vLLM's op."""
    graph = torch.fx.Graph()
    q = graph.placeholder("q")
    op = seam.attention_op()
    positional = graph.call_function(op, (q, q, q, q, DRAFT_TRITON))
    keyword = graph.call_function(
        op, (q, q, q, q), {"layer_name": DRAFT_TRITON, "output_scale": None}
    )
    assert seam.layer_name_value(positional, False) == DRAFT_TRITON
    assert seam.layer_name_value(keyword, False) == DRAFT_TRITON
    functionalized, _ = one_call_graph(DRAFT_TRITON)
    call = next(n for n in functionalized.nodes if n.target is auto_functionalized)
    assert seam.layer_name_value(call, True) == DRAFT_TRITON


def _draft_config(window):
    config = cpu_vllm_config({"splitting_ops": []}, additional_config={"draft_window_size": window})
    make_layers(config, [(DRAFT_TRITON, TritonAttentionBackend, False)])
    return config


def test_the_compile_context_can_be_injected():
    """No vLLM model on the stack and no current config: the injected context decides
    (config and draft tag); outside the block the pass raises as without vLLM."""
    config = _draft_config(80)
    the_pass = DraftWindowInductorPass(method="dflash")
    with override_compile_context(CompileContext(config, "draft_model", "test")):
        assert resolve_compile_context().vllm_config is config
        graph, call = one_call_graph(DRAFT_TRITON)
        assert the_pass.apply(graph)["rewritten"] == 1
        assert (call.kwargs["window_size"], call.kwargs["future_offset"]) == (80, 0)
        with override_compile_context(None):
            assert resolve_compile_context() is None
        assert the_pass.window_config().draft_window_size == 80
    graph, call = one_call_graph(DRAFT_TRITON)
    with pytest.raises(RuntimeError, match="not compiled by vLLM"):
        DraftWindowInductorPass(draft_window_size=64, method="dflash").apply(graph)


def test_the_vllm_pass_leaves_one_record_with_its_details():
    """Calling the vLLM pass (as vLLM does) leaves ONE ``PassRecord`` per graph in the
    shared record: its counters and, with the window on, the model tag, the rewritten
    layers and the resolved window (what the engine tier's probe reads)."""
    from dspark_compile.passes.record import clear_pass_records, pass_records

    config = _draft_config(80)
    the_pass = DraftWindowInductorPass(method="dflash")
    clear_pass_records()
    with override_compile_context(CompileContext(config, "draft_model", "test")):
        graph, _ = one_call_graph(DRAFT_TRITON)
        the_pass(graph)
    (record,) = pass_records()
    assert record.pass_name == the_pass.name
    assert record.stats["rewritten"] == 1
    assert record.details["model_tag"] == "draft_model"
    assert record.details["rewritten_layers"] == [DRAFT_TRITON]
    assert record.details["window"]["draft_window_size"] == 80
    # Window off: still one record (counters), no details.
    clear_pass_records()
    graph, _ = one_call_graph(DRAFT_TRITON)
    DraftWindowInductorPass(method="dflash")(graph)  # no config: the window is off
    (off,) = pass_records()
    assert off.details == {} and off.stats["rewritten"] == 0


class _DraftModel(torch.nn.Module):
    """Stands for a @support_torch_compile draft: vLLM sets both attributes."""

    def __init__(self, vllm_config):
        super().__init__()
        self.vllm_config = vllm_config
        self._compile_tag = "draft_model"

    def forward(self, x):
        return torch.sin(x) + 1


def _compile_once(model, the_pass, graphs):
    """A real Dynamo compile of ``model`` whose backend asks the pass for its ``uuid()``
    twice (as Inductor's cache key and vLLM's compiler manager do) and runs it on a graph
    holding one draft attention call."""

    def backend(gm, example_inputs):
        the_pass.uuid()
        the_pass.uuid()
        graph, call = one_call_graph(DRAFT_TRITON)
        the_pass(graph)
        graphs.append(call)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    compiled(torch.randn(4))
    torch._dynamo.reset()


@pytest.fixture
def walks(monkeypatch):
    """Stack walks of the compile-context lookup (the real one, counted)."""
    count = {"walks": 0}
    real = seam.compiling_model_on_stack

    def counted(*args, **kwargs):
        count["walks"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(seam, "compiling_model_on_stack", counted)
    return count


def test_the_config_is_resolved_once_per_compile(walks):
    config = _draft_config(72)
    the_pass, calls = DraftWindowInductorPass(method="dflash"), []
    _compile_once(_DraftModel(config), the_pass, calls)
    assert walks["walks"] == 1
    assert calls[0].kwargs["window_size"] == 72  # found the draft model on the stack
    _compile_once(_DraftModel(_draft_config(88)), the_pass, calls)
    assert walks["walks"] == 2  # a new compile resolves again, and sees the new config
    assert calls[1].kwargs["window_size"] == 88


def test_negative_control_outside_a_dynamo_compile_every_call_walks(walks, monkeypatch):
    monkeypatch.setattr(
        compile_context._DynamoCompileContext, "try_get", staticmethod(lambda: None)
    )
    config = _draft_config(72)
    _compile_once(_DraftModel(config), DraftWindowInductorPass(method="dflash"), [])
    assert walks["walks"] == 3  # two uuid() calls and the pass
