"""backend="dspark" end to end on CPU: compiled draft == eager windowed reference."""

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import dspark_compile
from dspark_compile import DraftWindowConfig, window_seq_lens_and_block_table_packed
from dspark_compile.passes.draft_window import _window_fn
from tests.draft_cases import make_draft_case, run_eager_reference

CASES = [
    # (seq_lens, q_lens, causal, method, num_speculative_tokens, W)
    ([37, 9, 64, 1], [1, 1, 1, 1], True, "eagle3", 2, 10),  # decode, W % b != 0
    ([40, 23, 8, 61], [8, 8, 8, 8], False, "dflash", 1, 12),  # DFlash blocks, W < q_len + ...
    ([50, 30, 5, 19], [6, 0, 5, 3], True, "dflash", 1, 16),  # empty request, seq < block
    ([33, 70], [4, 4], False, "dspark", 1, 200),  # W larger than every seq
    ([33, 70], [4, 4], False, "dflash", 1, 60),  # more window columns than
    ([5, 9, 17], [1, 1, 1], True, "dflash", 1, 40),  #   the full table has
    ([50, 30], [2, 2], False, "eagle3", 1, 33),
]


def _compile(model, lowering, **options):
    torch._dynamo.reset()
    return torch.compile(
        model, backend="dspark", options={"lowering": lowering, **options}, dynamic=False
    )


@pytest.mark.parametrize("lowering", ["aot_eager", "inductor"])
@pytest.mark.parametrize("seq_lens,q_lens,causal,method,nst,W", CASES)
def test_compiled_equals_windowed_reference(lowering, seq_lens, q_lens, causal, method, nst, W):
    case = make_draft_case(seq_lens, q_lens, causal=causal, seed=len(seq_lens) + W)
    config = DraftWindowConfig(draft_window_size=W, method=method, num_speculative_tokens=nst)
    want, want_keys, want_values = run_eager_reference(case, W, config.resolved_future_offset)
    full, _, _ = run_eager_reference(case, None)

    dspark_compile.clear_pass_records()
    compiled = _compile(
        case.model, lowering, draft_window_size=W, method=method, num_speculative_tokens=nst
    )
    keys, values = case.clone_caches()
    with torch.no_grad():
        got = compiled(*case.args(keys, values))

    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    if W < max(seq_lens):
        assert not torch.allclose(got, full, atol=1e-3), "the window must change the output"
    # KV writes go to the same absolute slots as eager (slot_mapping is not
    # windowed): the same cache rows change, to the same values.
    for layer, (k, wk, v, wv) in enumerate(zip(keys, want_keys, values, want_values)):
        original_k, original_v = case.key_caches[layer], case.value_caches[layer]
        assert torch.equal((k != original_k).any(-1), (wk != original_k).any(-1))
        assert torch.equal((v != original_v).any(-1), (wv != original_v).any(-1))
        torch.testing.assert_close(k, wk, rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(v, wv, rtol=2e-5, atol=2e-5)
    [record] = [r for r in dspark_compile.pass_records() if r.pass_name == "draft_window"]
    assert record.stats["attention_calls"] == record.stats["rewritten"] == 3
    assert record.stats["window_computations"] == 1


@pytest.mark.parametrize("lowering", ["aot_eager", "inductor"])
def test_window_off_matches_full_attention(lowering):
    case = make_draft_case([29, 17], [4, 4], causal=True)
    want, _, _ = run_eager_reference(case, None)
    dspark_compile.clear_pass_records()
    compiled = _compile(case.model, lowering)
    keys, values = case.clone_caches()
    with torch.no_grad():
        got = compiled(*case.args(keys, values))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    [record] = dspark_compile.pass_records()
    assert record.stats["rewritten"] == 0 and record.stats["attention_calls"] == 3


def test_graph_without_attention_is_left_unchanged():
    dspark_compile.clear_pass_records()
    torch._dynamo.reset()
    fn = torch.compile(
        lambda x: torch.relu(x) * 2,
        backend="dspark",
        options={"draft_window_size": 8, "lowering": "aot_eager"},
    )
    x = torch.randn(5)
    torch.testing.assert_close(fn(x), torch.relu(x) * 2)
    [record] = dspark_compile.pass_records()
    assert record.stats == {
        "attention_calls": 0,
        "rewritten": 0,
        "window_computations": 0,
        "host_mirrors_windowed": 0,
        "upper_bounds_windowed": 0,
    }


def test_post_pass_graph_has_one_window_for_all_layers():
    """Inspect the graph the pass produced: one gather feeds every attention call."""
    captured = {}

    def hook(stage, graph):
        if stage == "after_draft_window":
            captured["graph"] = str(graph)
            captured["nodes"] = [(n.op, n.target, n) for n in graph.nodes]

    case = make_draft_case([45, 12], [1, 1], causal=True, num_layers=4)
    from dspark_compile.backend import build_passes
    from dspark_compile.passes import PassManager

    manager = PassManager(
        build_passes(DraftWindowConfig(draft_window_size=8), "none"), graph_hook=hook
    )
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def fw(gm, _):
        manager(gm.graph)
        gm.recompile()
        return make_boxed_func(gm)

    torch._dynamo.reset()
    compiled = torch.compile(case.model, backend=aot_autograd(fw_compiler=fw), dynamic=False)
    with torch.no_grad():
        compiled(*case.args(*case.clone_caches()))
    nodes = captured["nodes"]
    attention = [n for op, t, n in nodes if t == torch.ops.dspark.paged_attention.default]
    arange = [n for op, t, n in nodes if t == torch.ops.aten.arange.default]
    assert len(attention) == 4
    # One window computation (one flat iota over the packed buffer) serves all layers.
    assert len([n for n in arange if not n.meta["val"].is_floating_point()]) == 1
    table_nodes = {a.args[3] for a in attention}
    len_nodes = {a.args[4] for a in attention}
    assert len(table_nodes) == 1 and len(len_nodes) == 1
    [table], [lens] = table_nodes, len_nodes
    if _window_fn() is window_seq_lens_and_block_table_packed:  # torch >= 2.14
        # Both are views of the one packed buffer.
        assert table.target == lens.target == torch.ops.aten.as_strided.default
        assert table.args[0] is lens.args[0]
        assert lens.args[0].target == torch.ops.aten.where.self
    # slot_mapping feeds KV writes only, never the window.
    writes = [n for op, t, n in nodes if "auto_functionalized" in str(t)]
    assert len(writes) == 4
    slot_mappings = {n.kwargs["slot_mapping"] for n in writes}
    assert len(slot_mappings) == 1
    [slot_mapping] = slot_mappings
    assert slot_mapping.op == "placeholder"
    assert set(slot_mapping.users) == set(writes)


def test_inductor_fuses_window_arithmetic_and_gather_into_one_kernel():
    """On CPU, Inductor emits the window (lengths + gathered table) as ONE C++ kernel
    launched once per step, and every layer's attention reads its outputs."""
    case = make_draft_case([45, 12, 30], [1, 1, 1], causal=True, num_layers=3)
    compiled = torch.compile(
        case.model, backend="dspark", options={"draft_window_size": 8}, dynamic=False
    )
    with torch.no_grad():
        _, [code] = run_and_get_code(compiled, *case.args(*case.clone_caches()))
    call_body = code[code.index("def call(") :]
    # The window's floor(x / b): a helper call (floor_divide_integral on torch 2.14,
    # div_floor_integer) or, on torch 2.11, inlined as
    # "(a < 0) != (b < 0) ? (a % b != 0 ? a / b - 1 : a / b) : a / b"; the gather is an
    # indexed load.
    window_kernels = [
        name
        for name, body in _cpp_kernels(code).items()
        if "floor_divide_integral" in body
        or "div_floor_integer" in body
        or re.search(r"% \w+ != 0 \? \w+ / \w+ - 1 :", body)
    ]
    assert len(window_kernels) == 1, code
    launches = re.findall(rf"^\s*{window_kernels[0]}\((.*)\)$", call_body, re.M)
    assert len(launches) == 1
    kernel_args = {a.strip() for a in launches[0].split(",")}
    attention = re.findall(
        r"torch\.ops\.dspark\.paged_attention\.default\((.*)\)$", call_body, re.M
    )
    assert len(attention) == 3
    if _window_fn() is not window_seq_lens_and_block_table_packed:  # torch < 2.14
        for call in attention:  # (query, key_cache, value_cache, table, lens, ...)
            args = [a.strip() for a in call.split(",")]
            assert {args[3], args[4]} <= kernel_args, call
        return
    # Every layer reads the windowed table and lengths (and, causal, kv_offset)
    # as views of ONE buffer that the window kernel wrote.
    buffers = set()
    for call in attention:
        views = re.findall(r"reinterpret_tensor\((buf\d+),", call)
        assert len(views) == 3 and len(set(views)) == 1, call
        assert "kv_offset=reinterpret_tensor" in call, call
        buffers.add(views[0])
    assert len(buffers) == 1 and buffers <= kernel_args


def _cpp_kernels(code: str) -> dict:
    kernels = {}
    for match in re.finditer(r"(cpp_fused_\w+) = async_compile\.cpp_pybinding\(", code):
        end = code.find("''')", match.end())
        kernels[match.group(1)] = code[match.end() : end]
    return kernels


def test_unknown_option_lists_valid_ones():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend="dspark", options={"windw": 8})
    with pytest.raises(
        ValueError,
        match=r"unknown dspark option 'windw'=8: valid options are "
        r"draft_window_size",
    ):
        fn(torch.ones(2))


def test_bad_lowering_is_rejected():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend="dspark", options={"lowering": "tvm"})
    with pytest.raises(
        ValueError, match=r"lowering='tvm' is invalid: expected one of inductor, aot_eager"
    ):
        fn(torch.ones(2))


def test_user_post_grad_pass_is_chained():
    from torch._inductor import config as inductor_config

    seen = []
    torch._dynamo.reset()
    with inductor_config.patch(post_grad_custom_post_pass=lambda g: seen.append(len(g.nodes))):
        fn = torch.compile(lambda x: x * 3, backend="dspark", options={"draft_window_size": 8})
        fn(torch.ones(3))
    assert seen, "the pass set before compiling must still run"
