"""The draft-window pass inside real vLLM 0.33.0: config, PostGradPassManager, graphs."""

import copy
import logging
import operator
import os
import pickle
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import tomllib
import torch
from torch._higher_order_ops.auto_functionalize import auto_functionalized

pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")

from vllm.compilation.passes.inductor_pass import CallableInductorPass, pass_context
from vllm.config import CompilationConfig, SpeculativeConfig, set_current_vllm_config
from vllm.config.utils import Range
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.attention.attention import Attention
from vllm.v1.attention.backends.flex_attention import FlexAttentionBackend
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

import dspark_compile.validation
import dspark_compile_vllm
from dspark_compile.integrations.vllm import DraftWindowInductorPass
from dspark_compile.passes import stats as keys
from tests.vllm_helpers import cpu_pass_manager, cpu_vllm_config

ROOT = Path(__file__).resolve().parents[1]
PASS_QUALNAME = "dspark_compile_vllm.draft_window_pass"
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
DRAFT_TRITON = "draft.layers.0.self_attn.attn"
DRAFT_TRITON_2 = "draft.layers.1.self_attn.attn"
TARGET = "model.layers.0.self_attn.attn"
DRAFT_FLEX = "draft.layers.2.self_attn.attn"
ATTENTION_OP = torch.ops.vllm.unified_attention_with_output.default


def make_layers(config, specs):
    """Real vLLM Attention layers registered in ``config``'s static forward context."""
    with set_current_vllm_config(config):
        layers = [
            Attention(
                HEADS,
                HEAD_DIM,
                HEAD_DIM**-0.5,
                num_kv_heads=KV_HEADS,
                prefix=name,
                attn_backend=backend,
            )
            for name, backend, _ in specs
        ]
    for layer, (_, _, is_draft) in zip(layers, specs):
        layer.use_direct_call = False  # as on CUDA: the model calls torch.ops.vllm.*
        layer.is_draft_layer = is_draft  # what vLLM's proposer load_model sets
    return layers


class Model(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.attn = torch.nn.ModuleList(layers)

    def forward(self, q, k, v):
        return sum(layer(q, k, v) for layer in self.attn)


def one_call_graph(layer_name):
    """Post-grad shape of one attention call: auto_functionalized(vllm op, layer_name=...)."""
    graph = torch.fx.Graph()
    q, out = graph.placeholder("q"), graph.placeholder("out")
    call = graph.call_function(
        auto_functionalized,
        (ATTENTION_OP,),
        {
            "query": q,
            "key": q,
            "value": q,
            "output": out,
            "layer_name": layer_name,
            "output_scale": None,
            "output_block_scale": None,
            "kv_cache_dummy_dep": None,
        },
    )
    graph.output(graph.call_function(operator.getitem, (call, 1)))
    return graph, call


@pytest.fixture(scope="module")
def compiled_graphs():
    """One real compile: two draft layers and a target layer, eagle3 K=3.

    (vLLM's FlashAttentionImpl cannot be built without a GPU: "FlashAttention
    version not detected"; its metadata is covered in test_vllm_metadata.py.)
    """
    config = cpu_vllm_config(
        {
            "splitting_ops": [],
            "inductor_compile_config": {
                "post_grad_custom_post_pass": DraftWindowInductorPass(
                    method="eagle3", num_speculative_tokens=3
                )
            },
        },
        additional_config={"draft_window_size": 64},
    )
    layers = make_layers(
        config,
        [
            (DRAFT_TRITON, TritonAttentionBackend, True),
            (TARGET, TritonAttentionBackend, False),
            (DRAFT_TRITON_2, TritonAttentionBackend, True),
        ],
    )
    manager = cpu_pass_manager(config)
    # added exactly as vllm/compilation/backends.py configure_post_pass does
    manager.add(config.compilation_config.inductor_compile_config["post_grad_custom_post_pass"])
    graphs = []
    manager.add(
        CallableInductorPass(lambda graph: graphs.append(copy.deepcopy(graph)), uuid="recorder")
    )

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        patches = dict(config.compilation_config.inductor_compile_config)
        patches.update(post_grad_custom_post_pass=manager, fx_graph_cache=False)
        return compile_fx(gm, example_inputs, config_patches=patches)

    torch._dynamo.reset()
    compiled = torch.compile(Model(layers), backend=backend, fullgraph=True)
    q, kv = torch.randn(5, HEADS * HEAD_DIM), torch.randn(5, KV_HEADS * HEAD_DIM)
    # attn_metadata None: vLLM's profile-run path (attention writes zeros, no KV write)
    with (
        set_current_vllm_config(config),
        pass_context(Range(start=1, end=8)),
        set_forward_context({layer.layer_name: None for layer in layers}, config, slot_mapping={}),
    ):
        out = compiled(q, kv, kv)
    torch._dynamo.reset()
    return graphs, out


def _calls(graph):
    """(op, layer name, extra kwargs) of every attention-like call in a graph."""
    found = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not auto_functionalized:
            continue
        value = node.kwargs.get("layer_name")
        if isinstance(value, torch.fx.Node):
            value = getattr(value.meta["val"], "real_obj", value.meta["val"])
        name = getattr(value, "value", value)
        found.append(
            (
                str(node.args[0]),
                name,
                {k: node.kwargs[k] for k in ("window_size", "future_offset") if k in node.kwargs},
            )
        )
    return found


def test_draft_calls_rewritten_target_and_kv_update_untouched(compiled_graphs):
    graphs, out = compiled_graphs
    assert len(graphs) == 1 and torch.equal(out, torch.zeros_like(out))
    calls = _calls(graphs[0])
    attention = {name: (op, extra) for op, name, extra in calls if "kv_cache_update" not in op}
    window = {"window_size": 64, "future_offset": 3}
    assert attention == {
        DRAFT_TRITON: ("dspark.unified_attention_with_output_windowed.default", window),
        DRAFT_TRITON_2: ("dspark.unified_attention_with_output_windowed.default", window),
        TARGET: ("vllm.unified_attention_with_output.default", {}),
    }
    ops = [str(n.target) for n in graphs[0].nodes if n.op == "call_function"]
    assert ops.count("vllm.unified_kv_cache_update.default") == 3
    # The vLLM pass records the same counters as our own window pass.
    [record] = [
        r for r in dspark_compile.pass_records() if r.pass_name == keys.VLLM_DRAFT_WINDOW_PASS
    ][-1:]
    assert record.stats[keys.ATTENTION_CALLS] == 3 and record.stats[keys.REWRITTEN] == 2


def test_qualname_resolves_to_our_instance_through_compilation_config():
    compilation = CompilationConfig(inductor_passes={"post_grad_custom_post_pass": PASS_QUALNAME})
    resolved = compilation.inductor_compile_config["post_grad_custom_post_pass"]
    assert resolved is dspark_compile_vllm.draft_window_pass  # not a CallableInductorPass
    assert isinstance(resolved, DraftWindowInductorPass)


def test_uuid_covers_the_window_and_survives_pickle():
    configs = {
        w: cpu_vllm_config(
            {"splitting_ops": []},
            speculative_config=_ngram(),
            additional_config={"draft_window_size": w},
        )
        for w in (64, 128)
    }
    graph_pass = DraftWindowInductorPass(method="dflash")
    uuids = {}
    for window, config in configs.items():
        with set_current_vllm_config(config):
            uuids[window] = graph_pass.uuid()
            assert graph_pass.uuid() == uuids[window]
            clone = pickle.loads(pickle.dumps(graph_pass))
            assert clone.uuid() == uuids[window]
            assert copy.deepcopy(graph_pass).uuid() == uuids[window]
            manager = cpu_pass_manager(config)
            manager.add(graph_pass)
            with pass_context(Range(start=1, end=8)):
                uuids[("manager", window)] = manager.uuid()
    assert uuids[64] != uuids[128]
    assert uuids[("manager", 64)] != uuids[("manager", 128)]
    # explicit constructor arguments win over the VllmConfig
    with set_current_vllm_config(configs[64]):
        assert DraftWindowInductorPass(draft_window_size=128, method="dflash").uuid() == uuids[128]
    assert (
        DraftWindowInductorPass(draft_window_size=64, method="dflash").uuid()
        != DraftWindowInductorPass(draft_window_size=64, method="eagle3").uuid()
    )


def _ngram(num_speculative_tokens=3):
    # The one speculative method vLLM builds without downloading a draft model.
    return SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=num_speculative_tokens,
        prompt_lookup_max=4,
        prompt_lookup_min=1,
    )


def test_missing_additional_config_is_a_noop_with_one_info_log(caplog, monkeypatch):
    import dspark_compile.integrations.vllm.inductor_pass as module

    monkeypatch.setattr(dspark_compile.validation, "_WARNED", set())  # not logged yet
    config = cpu_vllm_config({"splitting_ops": []})
    make_layers(config, [(DRAFT_TRITON, TritonAttentionBackend, True)])
    graph, call = one_call_graph(DRAFT_TRITON)
    before = str(graph)
    with caplog.at_level(logging.INFO, logger=module.__name__):
        for _ in range(2):
            stats = dspark_compile_vllm.draft_window_pass.apply(graph, config)
    assert str(graph) == before and call.args[0] is ATTENTION_OP
    assert stats[keys.REWRITTEN] == 0 and stats[keys.ATTENTION_CALLS] == 0
    infos = [r for r in caplog.records if "draft window off" in r.getMessage()]
    assert len(infos) == 1 and "additional_config" in infos[0].getMessage()


EAGLE3 = {"method": "eagle3"}


@pytest.mark.parametrize(
    "window,spec,overrides,match",
    [
        (0, True, EAGLE3, "draft_window_size=0 is invalid: expected a positive int"),
        ("2048", True, EAGLE3, "draft_window_size='2048' is invalid"),
        (2, True, EAGLE3, "future_offset=3 is invalid for draft_window_size=2"),
        (
            64,
            True,
            {},
            "speculative_config.method='ngram' is not supported.*"
            "eagle3, eagle, draft_model, dflash, dspark, mtp",
        ),
        (64, False, {}, "speculative_config is None"),
    ],
)
def test_bad_config_values_raise(window, spec, overrides, match):
    config = cpu_vllm_config(
        {"splitting_ops": []},
        additional_config={"draft_window_size": window},
        speculative_config=_ngram() if spec else None,
    )
    with pytest.raises(ValueError, match=match):
        DraftWindowInductorPass(**overrides).window_config(config)


def test_bad_constructor_values_raise_at_construction():
    with pytest.raises(ValueError, match="draft_window_size=-1 is invalid"):
        DraftWindowInductorPass(draft_window_size=-1)
    with pytest.raises(ValueError, match="method='medusa' is invalid"):
        DraftWindowInductorPass(method="medusa")


def test_num_speculative_tokens_read_from_speculative_config():
    config = cpu_vllm_config(
        {"splitting_ops": []},
        speculative_config=_ngram(5),
        additional_config={"draft_window_size": 64},
    )
    window = DraftWindowInductorPass(method="eagle3").window_config(config)
    assert (window.draft_window_size, window.resolved_future_offset) == (64, 5)


def test_mtp_disables_the_window_with_a_warning(caplog):
    config = cpu_vllm_config({"splitting_ops": []}, additional_config={"draft_window_size": 64})
    with caplog.at_level(logging.WARNING):
        window = DraftWindowInductorPass(method="mtp").window_config(config)
    assert not window.enabled and "method='mtp'" in caplog.text


def test_unsupported_draft_backend_fails_at_compile_time():
    config = cpu_vllm_config({"splitting_ops": []}, additional_config={"draft_window_size": 64})
    make_layers(config, [(DRAFT_FLEX, FlexAttentionBackend, True)])
    graph, _ = one_call_graph(DRAFT_FLEX)
    with pytest.raises(
        ValueError,
        match=f"draft layer {DRAFT_FLEX} uses attention backend "
        "'FLEX_ATTENTION'.*supports FLASH_ATTN, TRITON_ATTN, "
        "CPU_ATTN",
    ):
        DraftWindowInductorPass(method="dflash").apply(graph, config)


def test_draft_mla_call_is_reported_not_silently_skipped(caplog):
    import vllm.model_executor.layers.attention.mla_attention  # noqa: F401  (registers the op)

    config = cpu_vllm_config({"splitting_ops": []}, additional_config={"draft_window_size": 64})
    make_layers(config, [(DRAFT_TRITON, TritonAttentionBackend, True)])
    graph = torch.fx.Graph()
    q, out = graph.placeholder("q"), graph.placeholder("out")
    mla = torch.ops.vllm.unified_mla_attention_with_output.default
    call = graph.call_function(
        auto_functionalized,
        (mla,),
        {"q": q, "kv_c_normed": q, "k_pe": q, "output": out, "layer_name": DRAFT_TRITON},
    )
    graph.output(graph.call_function(operator.getitem, (call, 1)))
    with caplog.at_level(logging.WARNING):
        stats = DraftWindowInductorPass(method="dflash").apply(graph, config)
    assert stats["draft_mla_unwindowed"] == 1 and call.args[0] is mla
    assert f"draft layer {DRAFT_TRITON} uses MLA attention" in caplog.text


def test_unknown_layer_left_unwindowed_with_a_warning(caplog):
    config = cpu_vllm_config({"splitting_ops": []}, additional_config={"draft_window_size": 64})
    graph, call = one_call_graph("nowhere.attn")
    with caplog.at_level(logging.WARNING):
        stats = DraftWindowInductorPass(method="dflash").apply(graph, config)
    assert stats["unknown_untouched"] == 1 and call.args[0] is ATTENTION_OP
    assert "'nowhere.attn'" in caplog.text


def test_attention_split_out_warns_once_naming_the_fix(caplog, monkeypatch):
    import dspark_compile.integrations.vllm.inductor_pass as module

    monkeypatch.setattr(dspark_compile.validation, "_WARNED", set())  # not warned yet
    config = cpu_vllm_config(additional_config={"draft_window_size": 64})  # default: piecewise
    graph = torch.fx.Graph()
    graph.output(graph.placeholder("x"))  # a piecewise submodule: no attention inside
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        for _ in range(2):
            stats = DraftWindowInductorPass(method="dflash").apply(graph, config)
    warnings = [r.getMessage() for r in caplog.records if r.name == module.__name__]
    assert stats["attention_calls"] == 0 and len(warnings) == 1
    assert '"splitting_ops": []' in warnings[0] and "use_inductor_graph_partition" in warnings[0]


def _plugin_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [(name, value)] = project["entry-points"]["vllm.general_plugins"].items()
    return EntryPoint(name=name, value=value, group="vllm.general_plugins")


PLUGIN_ONLY = """
import sys
from importlib.metadata import EntryPoint

import torch

def registered():
    return hasattr(torch.ops.dspark, "unified_attention_with_output_windowed")

assert not registered(), "registered before the plugin was loaded"
EntryPoint(name={name!r}, value={value!r}, group="vllm.general_plugins").load()()
assert registered(), "the plugin entry point did not register the op"
schema = torch.ops.dspark.unified_attention_with_output_windowed.default._schema
assert any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments), schema
print("registered")
"""


def test_plugin_entry_point_in_pyproject_loads_and_registers_the_op():
    """In a fresh interpreter, loading only the pyproject entry point and calling it
    registers the windowed op (absent before: the check can fail)."""
    entry = _plugin_entry_point()
    result = subprocess.run(
        [sys.executable, "-c", PLUGIN_ONLY.format(name=entry.name, value=entry.value)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and result.stdout.strip() == "registered", result.stderr


def test_vllm_finds_the_plugin_by_entry_point():
    """vLLM's own loader (needs the package installed: ``pip install -e .``)."""
    from vllm.plugins import load_plugins_by_group

    plugins = load_plugins_by_group("vllm.general_plugins")
    assert _plugin_entry_point().name in plugins
    plugins[_plugin_entry_point().name]()


def test_windowed_op_is_left_outside_cuda_graph_partitions():
    """Under use_inductor_graph_partition, vLLM 0.33 partitions at its splitting ops
    (attention ops) through torch._inductor.config.custom_should_partition_ops; our
    op is not in that list, so it carries torch.Tag.cudagraph_unsafe, which
    Inductor's partitioner honours for any op: it runs outside every captured
    partition, so host values it reads (max_query_len, max_seq_len) are never
    frozen into a partition's graph."""
    from torch._inductor.utils import is_cudagraph_unsafe_fx_node
    from vllm.compilation.partition_rules import inductor_partition_rule_context

    from dspark_compile.integrations.vllm import windowed_attention_op

    op = windowed_attention_op()
    assert torch.Tag.cudagraph_unsafe in op.tags
    config = cpu_vllm_config(
        {
            "use_inductor_graph_partition": True,
            "inductor_passes": {"post_grad_custom_post_pass": PASS_QUALNAME},
        }
    )
    splitting = config.compilation_config.splitting_ops
    assert "vllm::unified_attention_with_output" in splitting  # vLLM's own rule
    assert op.name() not in splitting
    graph = torch.fx.Graph()
    q = graph.placeholder("q")
    node = graph.call_function(op, (q, q, q, q, "draft.layers.0.self_attn.attn", 64, 0, 8))
    with inductor_partition_rule_context(splitting):
        assert is_cudagraph_unsafe_fx_node(node)


@pytest.mark.parametrize(
    "tag,rewritten",
    [("eagle_head", True), ("draft_model", True), ("dflash_head", True), ("backbone", False)],
)
def test_draft_graph_found_by_model_tag_without_is_draft_layer(tag, rewritten):
    """vLLM 0.32 never sets is_draft_layer: the draft's graph is known by the model
    tag vLLM's proposer builds the draft under (``_compile_tag`` of the compiling model)."""
    config = cpu_vllm_config({"splitting_ops": []}, additional_config={"draft_window_size": 64})
    make_layers(config, [(DRAFT_TRITON, TritonAttentionBackend, False)])
    graph, call = one_call_graph(DRAFT_TRITON)
    stats = DraftWindowInductorPass(method="eagle3").apply(graph, config, model_tag=tag)
    assert stats["rewritten"] == int(rewritten)
    assert (call.args[0] is not ATTENTION_OP) == rewritten


class _CompilingModel:
    """Stands for a @support_torch_compile module: vLLM sets both attributes."""

    def __init__(self, vllm_config, tag):
        self.vllm_config = vllm_config
        self._compile_tag = tag

    def forward(self, run_pass, graph):
        return run_pass(graph)


def test_settings_come_from_the_compiling_models_config_not_the_current_one():
    """No current vLLM config (as in vLLM's compiles outside profile_run): the pass
    reads the VllmConfig of the model on the call stack, and its draft tag."""
    from vllm.config import get_current_vllm_config_or_none

    from dspark_compile.integrations.vllm.compile_context import find_compile_context

    config = cpu_vllm_config(
        {"splitting_ops": []},
        speculative_config=_ngram(4),
        additional_config={"draft_window_size": 96},
    )
    make_layers(config, [(DRAFT_TRITON, TritonAttentionBackend, False)])
    assert get_current_vllm_config_or_none() is None
    graph, call = one_call_graph(DRAFT_TRITON)
    the_pass = DraftWindowInductorPass(method="eagle3")
    stats = _CompilingModel(config, "eagle_head").forward(the_pass.apply, graph)
    assert stats["rewritten"] == 1
    assert (call.kwargs["window_size"], call.kwargs["future_offset"]) == (96, 4)
    assert call.kwargs["max_num_seqs"] == config.scheduler_config.max_num_seqs
    context = _CompilingModel(config, "draft_model").forward(lambda g: find_compile_context(), None)
    assert context.vllm_config is config and context.is_draft_model
    # uuid() resolves the same way: another window, another cache key
    other = cpu_vllm_config(
        {"splitting_ops": []},
        speculative_config=_ngram(4),
        additional_config={"draft_window_size": 128},
    )
    uuids = {
        _CompilingModel(c, "eagle_head").forward(lambda g: the_pass.uuid(), None)
        for c in (config, other)
    }
    assert len(uuids) == 2


def test_window_without_any_vllm_config_raises():
    graph, _ = one_call_graph(DRAFT_TRITON)
    with pytest.raises(
        RuntimeError, match="draft_window_size=64 is set but this graph is not compiled by vLLM"
    ):
        DraftWindowInductorPass(draft_window_size=64, method="dflash").apply(graph)


# --- attention sinks (additional_config["draft_sink_size"], draft_sink_size=) ---


def test_sinks_from_additional_config_reach_the_call_only_when_set():
    """S > 0: the call gets sink_size and max_num_tokens (max_num_batched_tokens);
    S = 0 or absent: the call is exactly the one without sinks."""
    kwargs = {}
    for extra in ({"draft_sink_size": 20}, {"draft_sink_size": 0}, {}):
        config = cpu_vllm_config(
            {"splitting_ops": []},
            speculative_config=_ngram(3),
            additional_config={"draft_window_size": 96, **extra},
        )
        make_layers(config, [(DRAFT_TRITON, TritonAttentionBackend, True)])
        graph, call = one_call_graph(DRAFT_TRITON)
        assert DraftWindowInductorPass(method="eagle3").apply(graph, config)["rewritten"] == 1
        kwargs[extra.get("draft_sink_size")] = (
            {k: (v.name if isinstance(v, torch.fx.Node) else v) for k, v in call.kwargs.items()},
            config.scheduler_config.max_num_batched_tokens,
        )
    with_sinks, max_tokens = kwargs[20]
    assert (with_sinks["sink_size"], with_sinks["max_num_tokens"]) == (20, max_tokens)
    assert with_sinks["window_size"] == 96 and with_sinks["future_offset"] == 3
    assert kwargs[0][0] == kwargs[None][0]
    assert "sink_size" not in kwargs[0][0] and "max_num_tokens" not in kwargs[0][0]


def test_sink_argument_of_the_pass_overrides_additional_config():
    config = cpu_vllm_config(
        {"splitting_ops": []},
        speculative_config=_ngram(3),
        additional_config={"draft_window_size": 96, "draft_sink_size": 4},
    )
    assert DraftWindowInductorPass(method="dflash").window_config(config).draft_sink_size == 4
    assert (
        DraftWindowInductorPass(method="dflash", draft_sink_size=32)
        .window_config(config)
        .draft_sink_size
        == 32
    )
    assert (
        DraftWindowInductorPass(method="dflash", draft_sink_size=0)
        .window_config(config)
        .draft_sink_size
        == 0
    )
    # the window may come from additional_config: sinks alone are valid for the pass
    assert DraftWindowInductorPass(draft_sink_size=8).overrides.draft_sink_size == 8


@pytest.mark.parametrize(
    "extra,overrides,match",
    [
        ({"draft_sink_size": -1}, {}, "draft_sink_size=-1 is invalid: expected a non-negative int"),
        ({"draft_sink_size": "16"}, {}, "draft_sink_size='16' is invalid"),
        (
            {"draft_sink_size": 16, "draft_window_size": None},
            {},
            "draft_sink_size=16 is invalid without a window",
        ),
        (
            {},
            {"draft_sink_size": 16, "draft_window_size": None},
            "draft_sink_size=16 is invalid without a window",
        ),
    ],
)
def test_bad_sink_values_raise(extra, overrides, match):
    additional = {"draft_window_size": 64, **extra}
    additional = {k: v for k, v in additional.items() if v is not None}
    if "draft_window_size" in overrides and overrides["draft_window_size"] is None:
        additional.pop("draft_window_size", None)
        overrides = {k: v for k, v in overrides.items() if v is not None}
    config = cpu_vllm_config(
        {"splitting_ops": []}, additional_config=additional, speculative_config=_ngram()
    )
    with pytest.raises(ValueError, match=match):
        DraftWindowInductorPass(method="dflash", **overrides).window_config(config)


def test_bad_sink_constructor_values_raise_at_construction():
    with pytest.raises(ValueError, match="draft_sink_size=-2 is invalid"):
        DraftWindowInductorPass(draft_sink_size=-2)
    with pytest.raises(ValueError, match="draft_sink_size=3.5 is invalid"):
        DraftWindowInductorPass(draft_window_size=64, draft_sink_size=3.5)


def test_uuid_covers_the_sinks():
    uuids = {}
    for sinks in (None, 0, 16, 32):
        extra = {} if sinks is None else {"draft_sink_size": sinks}
        config = cpu_vllm_config(
            {"splitting_ops": []},
            speculative_config=_ngram(),
            additional_config={"draft_window_size": 64, **extra},
        )
        with set_current_vllm_config(config):
            uuids[sinks] = DraftWindowInductorPass(method="dflash").uuid()
            # explicit constructor arguments win over additional_config
            uuids[("explicit", sinks)] = DraftWindowInductorPass(
                method="dflash", draft_sink_size=16
            ).uuid()
    assert uuids[None] == uuids[0]
    assert len({uuids[0], uuids[16], uuids[32]}) == 3
    assert {uuids[("explicit", s)] for s in (None, 0, 16, 32)} == {uuids[16]}
