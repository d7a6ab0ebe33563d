"""vLLM's own Triton attention kernel (TRITON_INTERPRET=1, CPU) reads exactly the window.

Runs ``tests/vllm_triton_e2e.py`` in a fresh process (vLLM decides at import
whether to use triton; see that script's docstring) and checks its report.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRAFT = ("draft.layers.0.self_attn.attn", "draft.layers.1.self_attn.attn")
TARGET = "model.layers.0.self_attn.attn"


def test_draft_attention_matches_the_per_token_window_reference():
    pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "vllm_triton_e2e.py")],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    # one compiled graph: draft calls rewritten, the target call left as vLLM's
    [ops] = report["graph_attention_ops"]
    assert sorted(ops) == sorted(["dspark.unified_attention_with_output_windowed.default"] * 2
                                 + ["vllm.unified_attention_with_output.default"]), ops
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
    for step in ("causal", "decode", "noncausal", "long_causal"):   # 2D, 3D split-K, non-causal kernels, a block longer than W
        result = report[step]
        for name in DRAFT + (TARGET,):   # draft == per-token window reference, target == full
            assert result["errors"][name] < 1e-5, (step, name, result)
        # the window changes the answer there, so the comparison is not vacuous
        assert min(result["window_effect"][name] for name in DRAFT) > 1e-2, (step, result)
        assert result["windowed_metadata_objects"] == 1   # two draft layers, one window
        assert result["metadata_unchanged"]               # vLLM's metadata object untouched
