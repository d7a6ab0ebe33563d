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


def test_windowed_metadata_gives_the_windowed_reference_attention():
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
    # W=20, b=16: seq_len 71 -> start 48; 40 -> 16; shorter than the window -> 0
    assert report["causal"]["window_start"] == [48, 0]
    assert report["decode"]["window_start"] == [48, 0, 16, 0, 0]
    for step in ("causal", "decode", "noncausal"):   # 2D, 3D split-K, non-causal kernels
        result = report[step]
        for name in DRAFT + (TARGET,):   # draft == windowed reference, target == full
            assert result["errors"][name] < 1e-5, (step, name, result)
        # the window changes the answer there, so the comparison is not vacuous
        assert min(result["window_effect"][name] for name in DRAFT) > 1e-2, (step, result)
        assert result["windowed_metadata_objects"] == 1   # two draft layers, one window
        assert result["metadata_unchanged"]               # vLLM's metadata object untouched
