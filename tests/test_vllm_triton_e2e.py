"""vLLM's own Triton attention kernel (TRITON_INTERPRET=1, CPU) reads exactly the window
(without sinks: token exact; with sinks: the block-aligned window + sinks rule).

Runs ``tests/vllm_triton_e2e.py`` in a fresh process (vLLM decides at import
whether to use triton; see that script's docstring) and checks its report.
"""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRAFT = ("draft.layers.0.self_attn.attn", "draft.layers.1.self_attn.attn")
TARGET = "model.layers.0.self_attn.attn"


@functools.lru_cache(maxsize=1)
def _report():
    """The script's report (one run serves both tests)."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "vllm_triton_e2e.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_draft_attention_matches_the_per_token_window_reference():
    pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")
    report = _report()
    # one compiled graph: draft calls rewritten, the target call left as vLLM's
    [ops] = report["graph_attention_ops"]
    assert sorted(ops) == sorted(
        ["dspark.unified_attention_with_output_windowed.default"] * 2
        + ["vllm.unified_attention_with_output.default"]
    ), ops
    # W=20, b=16, K=0. Causal: start of the FIRST query token's window,
    # floor(max(s - q + 1 - 20, 0) / 16) * 16: 71, q=3 -> 48 (windowed 23); 9 -> 0
    assert report["causal"]["windowed_seq_lens"] == [23, 9]
    assert report["decode"]["windowed_seq_lens"] == [23, 9, 24, 16, 33]
    # the 22-token block at s=90 starts at p=68: its window starts at 49 -> 48
    assert report["long_causal"]["windowed_seq_lens"] == [42, 24]
    # non-causal: the last token's window, floor(max(s - 20, 0) / 16) * 16
    assert report["noncausal"]["windowed_seq_lens"] == [27, 30]
    # draft layers carry Triton's native left window of W - K = 20 tokens
    assert report["causal"]["draft_sliding_window"] == [[19, 0], [19, 0], [-1, -1]]
    # 2D, 3D split-K, non-causal kernels, a block longer than W
    for step in ("causal", "decode", "noncausal", "long_causal"):
        result = report[step]
        for name in DRAFT + (TARGET,):  # draft == per-token window reference, target == full
            assert result["errors"][name] < 1e-5, (step, name, result)
        # the window changes the answer there, so the comparison is not vacuous
        assert min(result["window_effect"][name] for name in DRAFT) > 1e-2, (step, result)
        assert result["windowed_metadata_objects"] == 1  # two draft layers, one window
        assert result["metadata_unchanged"]  # vLLM's metadata object untouched


def _sink_len(s_t, window=20, block=16, sink_blocks=2):
    """Decode-form windowed length of seq_len s_t with sinks (plain formula)."""
    start = max(s_t - window, 0) // block * block
    return min(sink_blocks, start // block) * block + s_t - start


def test_draft_attention_with_sinks_matches_the_window_plus_sinks_reference():
    """draft_sink_size=20 (two sink blocks of 16): vLLM's Triton kernel on the per-token
    expanded metadata (causal) or the per-request window + sinks (non-causal), no
    native window, equals dense attention masked by the sink + window rule."""
    pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")
    report = _report()["sinks"]
    [ops] = report["graph_attention_ops"]
    assert sorted(ops) == sorted(
        ["dspark.unified_attention_with_output_windowed.default"] * 2
        + ["vllm.unified_attention_with_output.default"]
    ), ops
    # the draft calls carry the sinks and the token budget, the target call nothing
    assert sorted(map(str, report["sink_kwargs"])) == sorted(
        ["{'sink_size': 20, 'max_num_tokens': 2048}"] * 2 + ["{}"]
    )
    assert report["decode"]["windowed_seq_lens"] == [55, 9, 40, 16, 33, 52]
    assert report["causal"]["windowed_seq_lens"] == [53, 54, 55, 8, 9]  # empty request: no row
    assert report["long_causal"]["windowed_seq_lens"] == (
        [_sink_len(p + 1) for p in range(68, 90)] + [_sink_len(39), _sink_len(40)]
    )
    assert report["noncausal"]["windowed_seq_lens"] == [59, 30]
    for step, tokens in (("causal", 5), ("decode", 6), ("long_causal", 24)):
        result = report[step]
        assert result["expanded"], step
        assert result["rows"] == [list(range(tokens + 1)), 1, [tokens, 5]], (step, result["rows"])
    assert not report["noncausal"]["expanded"]
    assert report["noncausal"]["rows"] == [[0, 4, 5], 4, [2, 5]]
    for step in SINK_STEPS:
        result = report[step]
        assert result["draft_sliding_window"] == [[-1, -1]] * 3, step  # no native window
        for name in DRAFT + (TARGET,):
            assert result["errors"][name] < 1e-5, (step, name, result)
        # not vacuous: the window hides keys, and the sinks show keys the window hides
        assert min(result["window_effect"][name] for name in DRAFT) > 1e-2, (step, result)
        assert min(result["sink_effect"][name] for name in DRAFT) > 1e-2, (step, result)
        assert result["windowed_metadata_objects"] == 1
        assert result["metadata_unchanged"]


SINK_STEPS = ("causal", "decode", "noncausal", "long_causal")
