"""Engine tier: the draft window bounds the draft's KV memory in the real vLLM CPU engine.

Self-draft ``draft_model`` (K=3) of a 2-layer tiny Llama, CPU_ATTN, fp32, block
size 32, ``max_model_len`` 4096, W=256 (the ratio W / L = 1/16 of W=2048 at 32k),
chunked prefill with ``max_num_batched_tokens`` 128 (prompts up to 1500 tokens:
12 chunks), prefix caching on (a second round of the same prompts reads the
cache). Engines (``tests_engine/kv_engine_run.py``, one process each):

- ``nospec``: no speculation (the reference tokens and capacity);
- ``window``: the window with the draft's KV memory bounded (``kv_memory``);
- ``unbounded``: the same window with ``draft_window_kv_memory=False`` (the
  draft keeps full KV: the capacity of a self-draft without the bound, and the
  acceptance the bound must not change);
- ``preempt``: the bounded window with prefix caching off and a 90-block pool
  (``num_gpu_blocks_override``; ``max_model_len`` 1024 so one request fits):
  four 300-330-token prompts decode 200 tokens each, outgrow the pool and are
  preempted and recomputed (``nospec`` also generates them, as the reference).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import kv_engine_run  # noqa: E402

from dspark_compile.integrations.vllm import kv_spec  # noqa: E402

WINDOW, NUM_SPEC, BLOCK = 256, 3, 32
MAX_LEN, STEP_TOKENS = 4096, 128
PROMPT_LENS = [5, 300, 900, 1500]
MAX_TOKENS = 20
# preemption: four requests longer than the window that all fit at admission in a
# 90-block pool and then outgrow it while decoding (200 tokens: ~7 blocks each)
PREEMPT_LENS, PREEMPT_TOKENS, PREEMPT_BLOCKS = [300, 310, 320, 330], 200, 90


def kv_engine_specs(target: str) -> dict[str, dict]:
    base = dict(
        target=target,
        draft=target,
        window=WINDOW,
        bound=True,
        prefix_caching=True,
        max_num_batched_tokens=STEP_TOKENS,
        max_model_len=MAX_LEN,
        num_gpu_blocks_override=None,
        prompt_lens=PROMPT_LENS,
        max_tokens=MAX_TOKENS,
        rounds=2,
    )
    return {
        "nospec": dict(
            base,
            draft=None,
            window=None,
            extra=dict(prompt_lens=PREEMPT_LENS, max_tokens=PREEMPT_TOKENS),
        ),
        "window": base,
        "unbounded": dict(base, bound=False),
        "preempt": dict(
            base,
            prefix_caching=False,
            max_model_len=1024,
            num_gpu_blocks_override=PREEMPT_BLOCKS,
            rounds=1,
            prompt_lens=PREEMPT_LENS,
            max_tokens=PREEMPT_TOKENS,
        ),
    }


def _run(name: str, spec: dict, workdir: Path) -> dict:
    spec_path, report_path = workdir / f"{name}.json", workdir / f"{name}.report.json"
    if (
        os.environ.get("DSPARK_KV_REUSE")
        and report_path.exists()
        and spec_path.exists()
        and json.loads(spec_path.read_text()) == spec
    ):
        return json.loads(report_path.read_text())  # development: reuse a finished engine
    spec_path.write_text(json.dumps(spec))
    env = dict(
        os.environ,
        VLLM_CACHE_ROOT=str(workdir / f"cache-{name}"),
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    started = time.time()
    with open(workdir / f"{name}.log", "w") as log:
        run = subprocess.run(
            [sys.executable, str(HERE / "kv_engine_run.py"), str(spec_path), str(report_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=1500,
        )
    print(
        f"[kv tier] {name}: exit {run.returncode} after {time.time() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    if run.returncode != 0:
        return {
            "error": f"engine {name} exited {run.returncode}:\n"
            f"{(workdir / f'{name}.log').read_text()[-6000:]}"
        }
    return json.loads(report_path.read_text())


@pytest.fixture(scope="session")
def kv_engines(tmp_path_factory) -> dict[str, dict]:
    root = Path(os.environ.get("DSPARK_KV_WORKDIR") or tmp_path_factory.mktemp("kv"))
    root.mkdir(parents=True, exist_ok=True)
    target = kv_engine_run.build_target(root / "target", MAX_LEN)
    specs = kv_engine_specs(target)
    with ThreadPoolExecutor(max_workers=int(os.environ.get("DSPARK_ENGINE_JOBS", "2"))) as pool:
        futures = {name: pool.submit(_run, name, spec, root) for name, spec in specs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture
def eng(kv_engines):
    def get(name: str) -> dict:
        report = kv_engines[name]
        if "error" in report:
            pytest.fail(report["error"])
        return report

    return get


def test_draft_group_is_sliding_window_and_first(eng):
    report = eng("window")
    assert report["kv_memory"]["bounded"] is True
    groups = report["kv_cache_groups"]
    assert len(groups) == 2
    draft, target = groups
    assert draft["type"] == "SlidingWindowSpec" and draft["sliding_window"] == WINDOW - NUM_SPEC
    assert all(name.startswith("draft_model.") for name in draft["layers"])
    assert target["type"] == "FullAttentionSpec"
    assert not any(name.startswith("draft_model.") for name in target["layers"])
    assert [g["type"] for g in eng("unbounded")["kv_cache_groups"]] == ["FullAttentionSpec"]


def test_capacity_grows_by_the_predicted_amount(eng):
    """vLLM's own reported capacities: the window wins back >= 80% of what the draft
    costs, and each number is vLLM's arithmetic on its block count."""
    nospec, window, unbounded = eng("nospec"), eng("window"), eng("unbounded")
    assert window["max_num_batched_tokens"] == STEP_TOKENS
    full = kv_spec.full_blocks_per_request(BLOCK, MAX_LEN)
    sliding = kv_spec.sliding_blocks_per_request(WINDOW - NUM_SPEC, BLOCK, STEP_TOKENS, MAX_LEN)
    assert nospec["kv_cache_tokens"] == kv_spec.capacity_tokens(nospec["num_blocks"], full, MAX_LEN)
    assert unbounded["kv_cache_tokens"] == kv_spec.capacity_tokens(
        unbounded["num_blocks"], full, MAX_LEN
    )
    assert window["kv_cache_tokens"] == kv_spec.capacity_tokens(
        window["num_blocks"], full + sliding, MAX_LEN
    )
    assert window["kv_cache_tokens"] > unbounded["kv_cache_tokens"]
    recovered = kv_spec.recovered_fraction(
        nospec["kv_cache_tokens"], unbounded["kv_cache_tokens"], window["kv_cache_tokens"]
    )
    predicted = kv_spec.predicted_recovered_fraction(
        WINDOW, NUM_SPEC, BLOCK, STEP_TOKENS, MAX_LEN, 2, 2
    )
    print(
        f"KV capacity (tokens): no speculation {nospec['kv_cache_tokens']}, self-draft "
        f"{unbounded['kv_cache_tokens']}, self-draft + bounded window "
        f"{window['kv_cache_tokens']}: {recovered:.1%} of the draft's cost won back "
        f"(predicted {predicted:.1%})"
    )
    assert recovered == pytest.approx(predicted, abs=0.002)
    assert recovered >= 0.8


@pytest.mark.parametrize("name", ["window", "unbounded", "preempt"])
def test_greedy_output_is_the_targets(eng, name):
    nospec = eng("nospec")
    reference = nospec["extra"] if name == "preempt" else nospec["rounds"][0]
    assert nospec["rounds"][1] == nospec["rounds"][0]
    for tokens in eng(name)["rounds"]:
        assert tokens == reference


def test_bounding_changes_no_draft_token(eng):
    """Freeing the blocks outside the window changes nothing the draft reads: the
    draft proposes exactly the same tokens (same acceptance, per position)."""
    window, unbounded = eng("window")["metrics"], eng("unbounded")["metrics"]
    for key in (
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
    ):
        assert window[key] == unbounded[key], key
    assert window["vllm:spec_decode_num_accepted_tokens"] > 0


def test_prefix_cache_was_hit(eng):
    metrics = eng("window")["metrics"]
    assert metrics["vllm:prefix_cache_hits"] > 0


def test_preemption_happened(eng):
    report = eng("preempt")
    assert report["num_blocks"] == PREEMPT_BLOCKS
    assert report["metrics"]["vllm:num_preemptions"] > 0
    assert report["kv_cache_groups"][0]["type"] == "SlidingWindowSpec"
