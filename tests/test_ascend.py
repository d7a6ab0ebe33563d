"""Ascend route: GE convertibility of what our passes insert, check_ascend, torchair glue.

torchair/torch_npu cannot be installed here (no CANN); the glue tests use a
minimal stand-in that honours torchair's documented contract
(``CompilerConfig.post_grad_custom_post_pass(gm, example_inputs, config)`` runs
on the ATen graph inside its aot_autograd; ``npugraph_ex.compile_fx(gm, inputs)``
compiles an ATen graph) and run the real draft through it.
"""

import functools
import operator
import sys
import types
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import dspark_compile
from dspark_compile import DraftWindowConfig
from dspark_compile.backend import dspark_backend, graph_hook
from dspark_compile.options import parse_options
from dspark_compile.passes import DraftWindowPass, PassManager
from dspark_compile.routes.ge_converters import ge_convertible_ops, is_ge_convertible, op_name
from dspark_compile.routes.torchair import compile_with_torchair, on_npu
from tests.draft_cases import make_draft_case, run_eager_reference

TEST_DATA = Path(__file__).parent / "data" / "torchair_ge_converters.txt"


def _listed(path: Path) -> set[str]:
    return {
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }


def _inserted_nodes(model, args, options):
    """call_function nodes our passes insert on the NPU route (eager lowering, no decomps)."""
    before, inserted = {}, []

    def hook(stage, graph):
        if stage.startswith("before_"):
            before[id(graph)] = set(graph.nodes)
        else:
            inserted.extend(
                n for n in graph.nodes if n not in before[id(graph)] and n.op == "call_function"
            )

    backend = functools.partial(dspark_backend, options={**options, "lowering": "aot_eager"})
    with graph_hook(hook), torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(*args)
    return inserted


def test_test_data_is_a_subset_of_torchairs_converters():
    listed = _listed(TEST_DATA)
    assert listed <= ge_convertible_ops()
    assert (
        not {
            "torch.ops.aten.clamp_max.default",
            "torch.ops.aten.where.ScalarOther",
            "torch.ops.prims.iota.default",
        }
        & ge_convertible_ops()
    )


@pytest.mark.parametrize(
    "causal,options",
    [
        (True, {"draft_window_size": 10, "method": "eagle3", "num_speculative_tokens": 2}),
        (False, {"draft_window_size": 12, "method": "dflash"}),
        # attention sinks: kept = clamp(start_block, max=nsink), the column map (ge, mul, add)
        (
            True,
            {
                "draft_window_size": 10,
                "method": "eagle3",
                "num_speculative_tokens": 2,
                "draft_sink_size": 6,
            },
        ),
        (False, {"draft_window_size": 12, "method": "dflash", "draft_sink_size": 16}),
    ],
)
def test_window_pass_inserts_only_ge_convertible_ops(causal, options):
    case = make_draft_case([37, 9, 61], [2, 2, 2], causal=causal, num_layers=2)
    inserted = _inserted_nodes(case.model, case.args(*case.clone_caches()), options)
    names = {op_name(n.target) for n in inserted}
    assert "torch.ops.aten.gather.default" in names  # the window really was inserted
    assert names <= _listed(TEST_DATA), names - _listed(TEST_DATA)
    assert all(is_ge_convertible(n.target) for n in inserted)


def test_check_ascend_reports_unconvertible_ops_of_a_function():
    def fn(x, mask):
        y = torch.ops.aten.clamp_max(x, 1.0) + torch.ops.aten.clamp(x, min=0.0)
        return torch.where(mask, y, torch.ops.aten.clamp_min(y, 0.5))

    x, mask = torch.randn(6), torch.rand(6) > 0.5
    result = dspark_compile.check_ascend(fn, x, mask)
    assert not result.ok
    assert set(result.unsupported) == {"torch.ops.aten.clamp_max.default"}
    assert "clamp_max" in str(result)


def test_check_ascend_on_a_graph_module_and_a_clean_graph():
    gm = make_fx(lambda x: torch.minimum(x * 2, x.sum()))(torch.randn(4))
    result = dspark_compile.check_ascend(gm)
    assert result.ok and result.num_graphs == 1
    assert "convertible" in str(result)
    graph = torch.fx.Graph()
    x, mask = graph.placeholder("x"), graph.placeholder("mask")
    where = graph.call_function(torch.ops.aten.where.ScalarOther, (mask, x, 0.0))
    graph.output(graph.call_function(operator.getitem, ((where, x), 0)))
    # where.ScalarOther has no GE converter; getitem is evaluated in Python by torchair.
    assert dspark_compile.check_ascend(graph).unsupported == {
        "torch.ops.aten.where.ScalarOther": [where.name]
    }
    with pytest.raises(TypeError, match="fn_or_graph=3"):
        dspark_compile.check_ascend(3)


def test_check_ascend_on_the_reference_draft_flags_only_the_reference_custom_ops():
    case = make_draft_case([37, 9], [2, 2], num_layers=2)
    result = dspark_compile.check_ascend(
        case.model, *case.args(*case.clone_caches()), options={"draft_window_size": 12}
    )
    # The window arithmetic and the model's own ATen ops convert; the reference
    # attention / KV-write custom ops (CPU stand-ins for NPU kernels) do not.
    assert set(result.unsupported) == {
        "torch.ops.dspark.paged_attention.default",
        "torch.ops.higher_order.auto_functionalized_v2",
    }


def _fake_torchair(calls):
    """Stand-in honouring torchair's pass contract; lowers eagerly."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    class CompilerConfig:
        def __init__(self):
            self.mode = "max-autotune"
            self.post_grad_custom_post_pass = None

    def get_npu_backend(*, compiler_config):
        def forward_compiler(gm, inputs):
            compiler_config.post_grad_custom_post_pass(gm, inputs, compiler_config)
            calls.append(("torchair", compiler_config.mode, gm))
            return make_boxed_func(gm)

        return aot_autograd(fw_compiler=forward_compiler, keep_inference_input_mutations=True)

    return types.SimpleNamespace(CompilerConfig=CompilerConfig, get_npu_backend=get_npu_backend)


def _fake_npugraph_ex(calls):
    def compile_fx(gm, inputs):
        calls.append(("npugraph_ex", None, gm))
        return gm

    return types.SimpleNamespace(compile_fx=compile_fx)


@pytest.mark.parametrize("torchair_mode", ["reduce-overhead", "npugraph_ex"])
def test_torchair_route_runs_our_passes_on_the_aten_graph(monkeypatch, torchair_mode):
    calls = []
    monkeypatch.setitem(sys.modules, "torchair", _fake_torchair(calls))
    monkeypatch.setitem(sys.modules, "npugraph_ex", _fake_npugraph_ex(calls))
    case = make_draft_case([40, 23, 61], [4, 4, 4], causal=False, num_layers=2)
    want, _, _ = run_eager_reference(case, 12)
    config = DraftWindowConfig(draft_window_size=12)

    def backend(gm, example_inputs):
        manager = PassManager([DraftWindowPass(config, decompositions="none")])
        return compile_with_torchair(gm, example_inputs, manager, torchair_mode)

    dspark_compile.clear_pass_records()
    compiled = torch.compile(case.model, backend=backend, dynamic=False)
    keys, values = case.clone_caches()
    with torch.no_grad():
        got = compiled(*case.args(keys, values))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    [(compiler, mode, gm)] = calls
    assert compiler == ("npugraph_ex" if torchair_mode == "npugraph_ex" else "torchair")
    if compiler == "torchair":
        assert mode == torchair_mode
    targets = {n.target for n in gm.graph.nodes}
    assert torch.ops.aten.gather.default in targets  # torchair received the windowed graph
    [record] = dspark_compile.pass_records()
    assert record.stats["rewritten"] == 2 and record.stats["window_computations"] == 1


def test_torchair_route_without_torchair_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchair", None)  # import fails, as without CANN
    manager = PassManager([])
    with pytest.raises(RuntimeError, match="torchair_mode='max-autotune' needs the 'torchair'"):
        compile_with_torchair(None, [], manager, "max-autotune")
    with pytest.raises(ValueError, match="torchair_mode='ge'.*max-autotune, reduce-overhead"):
        compile_with_torchair(None, [], manager, "ge")


def test_backend_validates_torchair_mode():
    assert parse_options({"torchair_mode": "npugraph_ex"})[1].torchair_mode == "npugraph_ex"
    with pytest.raises(ValueError, match="torchair_mode='ge' is invalid"):
        parse_options({"torchair_mode": "ge"})


def test_backend_sends_npu_inputs_down_the_torchair_route(monkeypatch):
    import dspark_compile.backend as backend_module

    calls = []
    monkeypatch.setitem(sys.modules, "torchair", _fake_torchair(calls))
    monkeypatch.setattr(backend_module, "on_npu", lambda inputs: True)  # no NPU here
    case = make_draft_case([40, 23], [4, 4], causal=True, num_layers=2)
    want, _, _ = run_eager_reference(case, 12)
    compiled = torch.compile(
        case.model,
        backend="dspark",
        dynamic=False,
        options={"draft_window_size": 12, "torchair_mode": "reduce-overhead"},
    )
    keys, values = case.clone_caches()
    with torch.no_grad():
        got = compiled(*case.args(keys, values))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert [(compiler, mode) for compiler, mode, _ in calls] == [("torchair", "reduce-overhead")]
    assert not on_npu([torch.zeros(2), 3])
