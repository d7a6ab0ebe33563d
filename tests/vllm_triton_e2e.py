"""End to end through vLLM 0.33.0 on CPU: compile, window, run vLLM's Triton kernel.

Run as a script (``tests/test_vllm_triton_e2e.py`` does, in a fresh process):
vLLM decides at import time whether Triton is usable, and on a machine
without a GPU it only keeps the real ``triton`` module when
``CUDA_VISIBLE_DEVICES`` is set and empty (``vllm/triton_utils/importing.py``,
the "distributed environment" branch); ``TRITON_INTERPRET=1`` then runs
``vllm.v1.attention.ops.triton_unified_attention`` on CPU tensors.

Three real ``vllm`` ``Attention`` layers (Triton backend): two draft layers
(marked ``is_draft_layer`` like vLLM's proposer does) and one target layer.
The model is compiled by Inductor with vLLM's ``PostGradPassManager``
configured from a real ``VllmConfig`` whose ``compilation_config`` names our
pass. Prints one JSON line with the measured errors and counters.

The reference is dense attention with an explicit per-token mask: a causal
draft query at absolute position ``p`` reads exactly keys
``[max(p + 1 + K - W, 0), p]`` (the backend's native window), also when the
request's query block is longer than the window (step ``long_causal``); a
non-causal draft block reads ``[floor(max(s + K - W, 0) / b) * b, s)``; the
target reads everything causal attention allows.

A second model is compiled with attention sinks (``draft_sink_size``): its
draft calls get the per-token expanded metadata and no native window; the
reference is the block-aligned window + sinks rule by position (``sink_mask``).
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402
from vllm.compilation.passes.inductor_pass import (  # noqa: E402
    CallableInductorPass,
    pass_context,
)
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.config.utils import Range  # noqa: E402
from vllm.forward_context import get_forward_context, set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention.attention import Attention  # noqa: E402
from vllm.triton_utils import HAS_TRITON  # noqa: E402
from vllm.v1.attention.backends.triton_attn import (  # noqa: E402
    TritonAttentionBackend,
    TritonAttentionMetadata,
)

from dspark_compile.integrations.vllm import DraftWindowInductorPass  # noqa: E402
from dspark_compile.kernels.paged_attention import reshape_and_cache_ref  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vllm_helpers import cpu_pass_manager, cpu_vllm_config  # noqa: E402

WINDOW, BLOCK, HEADS, KV_HEADS, HEAD_DIM = 20, 16, 4, 2, 16  # W not a multiple of b
DRAFT = ("draft.layers.0.self_attn.attn", "draft.layers.1.self_attn.attn")
TARGET = "model.layers.0.self_attn.attn"


class Model(torch.nn.Module):
    def __init__(self, names):
        super().__init__()
        self.attn = torch.nn.ModuleList(
            Attention(
                HEADS,
                HEAD_DIM,
                HEAD_DIM**-0.5,
                num_kv_heads=KV_HEADS,
                prefix=name,
                attn_backend=TritonAttentionBackend,
            )
            for name in names
        )
        for layer in self.attn:
            layer.use_direct_call = False  # as on CUDA: call the torch.ops.vllm ops

    def forward(self, q, k, v):
        return [layer(q[i], k[i], v[i]) for i, layer in enumerate(self.attn)]


def split_cache(kv_cache):
    """Views ``[B, b, Hkv, D]`` of a vLLM Triton/FA cache, logical ``[B, Hkv, b, 2D]``."""
    cache = kv_cache.transpose(1, 2)
    return cache[..., :HEAD_DIM], cache[..., HEAD_DIM:]


def metadata(seq_lens, query_start_loc, block_table, slot_mapping, causal, threshold_3d):
    segments, num_tokens = 16, int(query_start_loc[-1])
    return TritonAttentionMetadata(
        num_actual_tokens=num_tokens,
        max_query_len=int((query_start_loc[1:] - query_start_loc[:-1]).max()),
        query_start_loc=query_start_loc,
        max_seq_len=int(seq_lens.max()),
        seq_lens=seq_lens,
        block_table=block_table,
        slot_mapping=slot_mapping,
        seq_threshold_3D=threshold_3d,
        num_par_softmax_segments=segments,
        softmax_segm_output=torch.empty(num_tokens, HEADS, segments, HEAD_DIM),
        softmax_segm_max=torch.empty(num_tokens, HEADS, segments),
        softmax_segm_expsum=torch.empty(num_tokens, HEADS, segments),
        causal=causal,
    )


# One compiled graph of NUM_TOKENS rows serves every step (rows past a step's
# tokens are padding, as in vLLM):
#  causal: a long request and one shorter than a block; 2D kernel
#  decode: five single-token requests, split-K threshold above them; 3D kernel
#  noncausal: a DFlash-style block whose queries see each other; 2D kernel
#  long_causal: a 22-token query block, longer than W (draft prefill)
STEPS = {
    "causal": dict(seq_lens=[71, 9], q_lens=[3, 2], causal=True, threshold_3d=0),
    "decode": dict(seq_lens=[71, 9, 40, 16, 33], q_lens=[1] * 5, causal=True, threshold_3d=64),
    "noncausal": dict(seq_lens=[75, 30], q_lens=[4, 1], causal=False, threshold_3d=0),
    "long_causal": dict(seq_lens=[90, 40], q_lens=[22, 2], causal=True, threshold_3d=0),
}
NUM_TOKENS, NUM_BLOCKS = 24, 40


def make_batch(seq_lens, q_lens):
    """Block table (distinct random blocks per request), query_start_loc, slot_mapping."""
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    width = 6
    table = torch.randperm(NUM_BLOCKS)[: len(seq_lens) * width].view(-1, width).int()
    query_start_loc = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    positions = torch.cat([torch.arange(int(s) - n, int(s)) for s, n in zip(seq_lens, q_lens)])
    req = torch.repeat_interleave(torch.arange(len(q_lens)), torch.tensor(q_lens))
    slots = table[req, positions // BLOCK].long() * BLOCK + positions % BLOCK
    return seq_lens, table, query_start_loc, slots


def dense_reference(
    query, key_cache, value_cache, table, seq_lens, query_start_loc, scale, allowed
):
    """Dense attention, every query row masked by ``allowed(p, s) -> (lo, hi)``: keys
    ``lo <= j < hi`` of its request, or by ``allowed(p, s) -> [s] bool`` mask over
    the request's positions (GQA by repeating KV heads)."""
    out = torch.zeros_like(query)
    for r, s in enumerate(seq_lens.tolist()):
        q0, q1 = int(query_start_loc[r]), int(query_start_loc[r + 1])
        pos = torch.arange(s)
        slots = table[r, pos // BLOCK].long() * BLOCK + pos % BLOCK
        keys = key_cache.reshape(-1, KV_HEADS, HEAD_DIM)[slots]
        values = value_cache.reshape(-1, KV_HEADS, HEAD_DIM)[slots]
        keys = keys.repeat_interleave(HEADS // KV_HEADS, 1)
        values = values.repeat_interleave(HEADS // KV_HEADS, 1)
        for t in range(q0, q1):
            p = s - (q1 - q0) + (t - q0)
            bounds = allowed(p, s)
            if isinstance(bounds, torch.Tensor):
                mask = bounds
            else:
                lo, hi = bounds
                mask = (pos >= lo) & (pos < hi)
            scores = torch.einsum("hd,jhd->hj", query[t], keys) * scale
            scores = scores.masked_fill(~mask[None, :], float("-inf"))
            out[t] = torch.einsum("hj,jhd->hd", torch.softmax(scores, -1), values)
    return out


def sink_mask(p, s, causal, sinks):
    """The window + sinks rule by position, in plain Python: a query at p sees keys
    j <= p (causal; else j < s) with j < S_b or j >= lo, S_b = ceil(S / b) * b,
    lo = floor(max(p + 1 - W, 0) / b) * b of p (causal) or of the last token."""
    sink_end = -(-sinks // BLOCK) * BLOCK
    anchor = p if causal else s - 1
    lo = max(anchor + 1 - WINDOW, 0) // BLOCK * BLOCK
    end = p + 1 if causal else s
    return torch.tensor([j < end and (j < sink_end or j >= lo) for j in range(s)])


def run_step(compiled, model, names, config, step, sinks=0):
    seq_lens, table, query_start_loc, slots = make_batch(step["seq_lens"], step["q_lens"])
    num_actual = int(query_start_loc[-1])
    q = torch.randn(len(names), NUM_TOKENS, HEADS * HEAD_DIM)
    k = torch.randn(len(names), NUM_TOKENS, KV_HEADS * HEAD_DIM)
    v = torch.randn(len(names), NUM_TOKENS, KV_HEADS * HEAD_DIM)
    for i, layer in enumerate(model.attn):
        layer.kv_cache = torch.randn(NUM_BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM)
        # This step's K/V at their absolute slots. vLLM's own KV-update kernel
        # (triton_reshape_and_cache_flash) asks torch.cuda for the device
        # capability and cannot run on CPU, so the forward context below
        # carries no slot_mapping (vLLM then skips the update) and the write
        # is done here with the reference.
        key_cache, value_cache = split_cache(layer.kv_cache)
        reshape_and_cache_ref(
            k[i, :num_actual].view(num_actual, KV_HEADS, HEAD_DIM),
            v[i, :num_actual].view(num_actual, KV_HEADS, HEAD_DIM),
            key_cache,
            value_cache,
            slots,
        )
    causal, threshold = step["causal"], step["threshold_3d"]
    for layer in model.attn:  # a fresh draft each step: causal (EAGLE) or not (DFlash)
        layer.impl.sliding_window = (-1, -1)
    draft_md = metadata(seq_lens, query_start_loc, table, slots, causal, threshold)
    target_md = metadata(seq_lens.clone(), query_start_loc, table.clone(), slots, causal, threshold)
    attn_metadata = {DRAFT[0]: draft_md, DRAFT[1]: draft_md, TARGET: target_md}
    original = (seq_lens.clone(), table.clone())
    with (
        set_current_vllm_config(config),
        pass_context(Range(start=1, end=NUM_TOKENS)),
        set_forward_context(attn_metadata, config, slot_mapping={}),
    ):
        outs = compiled(q, k, v)
        step_cache = get_forward_context().additional_kwargs.get(
            "dspark_windowed_attn_metadata", {}
        )

    def full(p, s):
        return (0, p + 1) if causal else (0, s)

    def windowed(p, s):
        if causal:
            return (max(p + 1 - WINDOW, 0), p + 1)  # K = 0 (dflash)
        return (max(s - WINDOW, 0) // BLOCK * BLOCK, s)

    def with_sinks(p, s):
        return sink_mask(p, s, causal, sinks)

    scale = HEAD_DIM**-0.5
    errors, window_effect, sink_effect = {}, {}, {}
    for i, (name, layer) in enumerate(zip(names, model.attn)):
        key_cache, value_cache = split_cache(layer.kv_cache)
        query = q[i, :num_actual].view(num_actual, HEADS, HEAD_DIM)
        args = (query, key_cache, value_cache, table, seq_lens, query_start_loc, scale)
        full_out, windowed_out = dense_reference(*args, full), dense_reference(*args, windowed)
        if sinks:
            # the block-aligned window + sinks, against the token-exact window without sinks
            sinks_out = dense_reference(*args, with_sinks)
            sink_effect[name] = float((sinks_out - windowed_out).abs().max())
            windowed_out = sinks_out
        expected = windowed_out if name in DRAFT else full_out
        out = outs[i][:num_actual].view(num_actual, HEADS, HEAD_DIM)
        errors[name] = float((out - expected).abs().max())
        window_effect[name] = float((windowed_out - full_out).abs().max())
    windowed_md = next(iter(step_cache.values()))[1] if step_cache else None
    return {
        "errors": errors,
        "window_effect": window_effect,
        "sink_effect": sink_effect,
        "expanded": bool(getattr(windowed_md, "dspark_expanded", False)),
        "rows": (
            None
            if windowed_md is None
            else [
                windowed_md.query_start_loc.tolist(),
                windowed_md.max_query_len,
                list(windowed_md.block_table.shape),
            ]
        ),
        "windowed_metadata_objects": len(step_cache),
        "metadata_unchanged": bool(
            torch.equal(draft_md.seq_lens, original[0])
            and torch.equal(draft_md.block_table, original[1])
        ),
        "windowed_seq_lens": windowed_md.seq_lens.tolist() if windowed_md is not None else None,
        "draft_sliding_window": [list(layer.impl.sliding_window) for layer in model.attn],
    }


def main() -> None:
    assert HAS_TRITON, "vLLM did not keep the real triton module"
    torch.manual_seed(0)
    report = compile_and_run({"draft_window_size": WINDOW}, STEPS)
    report["sinks"] = compile_and_run(
        {"draft_window_size": WINDOW, "draft_sink_size": SINKS}, SINK_STEPS, sinks=SINKS
    )
    print(json.dumps(report))


# With attention sinks (S = 20, S_b = 32: two sink blocks, S not a multiple of b),
# every causal call is expanded to one single-query row per token:
#  causal: a request with no queries between two others; 2D kernel
#  decode: windows starting at 0, inside the sinks (s=40: lo=16), right after them
#          (s=52: lo=32), past them (s=71: lo=48), seq_len < b; 3D split-K kernel
#  noncausal: the last token's window + sinks, no expansion
#  long_causal: a 22-token block longer than W, expanded rows on the 3D kernel
SINKS = 20
SINK_STEPS = {
    "causal": dict(seq_lens=[71, 50, 9], q_lens=[3, 0, 2], causal=True, threshold_3d=0),
    "decode": dict(seq_lens=[71, 9, 40, 16, 33, 52], q_lens=[1] * 6, causal=True, threshold_3d=64),
    "noncausal": dict(seq_lens=[75, 30], q_lens=[4, 1], causal=False, threshold_3d=0),
    "long_causal": dict(seq_lens=[90, 40], q_lens=[22, 2], causal=True, threshold_3d=64),
}


def compile_and_run(additional_config, steps, sinks=0):
    config = cpu_vllm_config(
        {
            "splitting_ops": [],
            "inductor_compile_config": {
                "post_grad_custom_post_pass": DraftWindowInductorPass(method="dflash")
            },
        },
        additional_config=additional_config,
    )
    names = DRAFT + (TARGET,)
    with set_current_vllm_config(config):
        model = Model(names)
    layers = config.compilation_config.static_forward_context
    for name in DRAFT:
        layers[name].is_draft_layer = True  # what vLLM's proposer load_model does

    manager = cpu_pass_manager(config)
    manager.add(config.compilation_config.inductor_compile_config["post_grad_custom_post_pass"])
    seen, seen_kwargs = [], []
    manager.add(CallableInductorPass(_Recorder(seen, seen_kwargs), uuid="recorder"))

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        patches = dict(config.compilation_config.inductor_compile_config)
        patches["post_grad_custom_post_pass"] = manager
        patches["fx_graph_cache"] = False
        return compile_fx(gm, example_inputs, config_patches=patches)

    compiled = torch.compile(model, backend=backend, fullgraph=True)
    report = {
        name: run_step(compiled, model, names, config, step, sinks) for name, step in steps.items()
    }
    report["graph_attention_ops"] = [[str(t) for t in ops] for ops in seen]
    report["sink_kwargs"] = [kw for kws in seen_kwargs for kw in kws]
    return report


class _Recorder:
    """Records the attention op of each call left in the graph after our pass."""

    def __init__(self, seen, seen_kwargs):
        self.seen, self.seen_kwargs = seen, seen_kwargs

    def __call__(self, graph):
        from torch._higher_order_ops.auto_functionalize import auto_functionalized

        ops, kwargs = [], []
        for node in graph.nodes:
            if node.op == "call_function" and node.target is auto_functionalized:
                ops.append(node.args[0])
                kwargs.append(
                    {k: node.kwargs[k] for k in ("sink_size", "max_num_tokens") if k in node.kwargs}
                )
        self.seen.append(ops)
        self.seen_kwargs.append(kwargs)


if __name__ == "__main__":
    sys.exit(main())
