"""vLLM's own Triton attention kernel (TRITON_INTERPRET=1, CPU) reads exactly the window.

Runs ``tests/vllm_triton_e2e.py`` in a fresh process (vLLM decides at import
whether to use triton; see that script's docstring) and checks its report.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAFT = ("draft.layers.0.self_attn.attn", "draft.layers.1.self_attn.attn")
TARGET = "model.layers.0.self_attn.attn"


def test_windowed_metadata_gives_the_windowed_reference_attention():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "vllm_triton_e2e.py")],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    # draft layers == windowed reference; target == full reference
    for name in DRAFT + (TARGET,):
        assert report["errors"][name] < 1e-5, (name, report)
    # and the window changes the answer there (the check is not vacuous)
    assert min(report["window_effect"][name] for name in DRAFT) > 1e-2, report
    assert report["window_start"] == [48, 0]          # W=20, b=16: 71+0-20=51 -> 48
    assert sorted(report["graph_attention_ops"]) == sorted(
        ["dspark.unified_attention_with_output_windowed.default"] * 2
        + ["vllm.unified_attention_with_output.default"])
    assert report["windowed_metadata_objects"] == 1   # two draft layers, one window
    assert report["metadata_unchanged"]               # vLLM's metadata object untouched
