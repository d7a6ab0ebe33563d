"""``benchmarks/bench_engine.py --side-by-side`` on real vLLM engines: two engines of the
committed trained pair (``tests_engine/data/trained_pair``: no speculation, and the draft
with W = its training context) start at once, and each cell runs on both in turn. The
record must hold every cell of both engines in rotated order, the engines' own records
(start time, KV cache), and greedy outputs identical to the target's own.

The schedule itself (timeouts, failed engines, deadline) is tested without vLLM in
``tests/test_engine_schedule.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PAIR = HERE / "data" / "trained_pair"
BENCH = ROOT / "benchmarks" / "bench_engine.py"


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> dict:
    if os.environ.get("DSPARK_ENGINE_DEVICE", "cpu") != "cpu":
        pytest.skip("the CPU tier's pair settings (fp32, block 32)")
    if not (PAIR / "target" / "model.safetensors").exists():
        pytest.fail(f"the trained pair is missing under {PAIR}")
    work = tmp_path_factory.mktemp("side_by_side")
    out = work / "r.json"
    env = dict(os.environ, VLLM_CACHE_ROOT=str(work / "cache"))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [
        sys.executable,
        str(BENCH),
        "--pair", str(PAIR),
        "--out", str(out),
        "--families", "draft_model",
        "--settings", "nospec,w1x",
        "--contexts", "64",
        "--batches", "1",
        "--temperatures", "0",
        "--repeats", "3",
        "--new-tokens", "16",
        "--num-speculative-tokens", "3",
        "--dtype", "float32",
        "--block-size", "32",
        "--side-by-side",
        "--max-seconds", "840",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if run.returncode != 0 or not out.exists():
        logs = "".join(p.read_text()[-3000:] for p in sorted(work.glob("r.work/*.log")))
        pytest.fail(f"bench_engine failed ({run.returncode}):\n{run.stdout[-4000:]}\n{logs}")
    return json.loads(out.read_text())


def test_every_cell_ran_on_both_engines_in_rotated_order(record):
    cells = record["cells"]
    assert [(c["setting"], c["repeat"]) for c in cells] == [
        ("nospec", 0), ("w1x", 0),
        ("w1x", 1), ("nospec", 1),
        ("nospec", 2), ("w1x", 2),
    ]  # fmt: skip
    assert all(c["context"] == 64 and c["output_tokens"] == 16 for c in cells)
    assert "side by side" in record["meta"]["schedule"]
    assert not [n for n in record["notes"] if "not run" in n or "failed" in n], record["notes"]


def test_the_engines_records_come_back(record):
    engines = {e["setting"]: e for e in record["engines"]}
    assert set(engines) == {"nospec", "w1x"}
    for e in engines.values():
        assert e["complete"] and e["cells"] == 3
        assert e["init_s"] > 0 and e["kv_cache_tokens"] > 0
    assert (
        engines["w1x"]["window"]
        == json.loads((PAIR / "train_report.json").read_text())["draft_context"]
    )


def test_greedy_outputs_are_the_targets_own(record):
    spec = [c for c in record["cells"] if c["setting"] == "w1x"]
    assert spec and all(c["lossless"] for c in spec), [c.get("lossless_requests") for c in spec]
    assert all(c["acceptance_length"] >= 1.0 for c in spec)
