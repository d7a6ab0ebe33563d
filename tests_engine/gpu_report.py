"""Write the GPU engine tier's results file from its engine reports and pytest log.

``python gpu_report.py RESULTS_DIR PYTEST_STATUS SECONDS``: reads
``RESULTS_DIR/engine-reports.json`` (conftest.py writes it when
``DSPARK_ENGINE_REPORTS`` is set) and ``RESULTS_DIR/pytest.log``, writes
``RESULTS_DIR/gpu-engine-tier.md``: date, device, driver, versions, git commit
(``DSPARK_GIT_COMMIT``: the device's copy of the tree has no ``.git``), the
pytest summary and one row per engine (configuration, vLLM's speculative
counters, whether the greedy tokens equal the baseline's, vLLM's error for
refused configurations).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path


def _versions() -> dict[str, str]:
    import torch
    import triton
    import vllm

    driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "device": torch.cuda.get_device_name(0),
        "driver": driver,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm": vllm.__version__,
        "python": sys.version.split()[0],
    }


def _row(name: str, report: dict, reports: dict) -> str:
    spec = report["spec"]
    window = spec["window"] if spec["window"] is not None else "off"
    config = (
        f"{spec['method']} ({spec['draft_key']}) | {spec['backend']} | {spec['graphs']} | "
        f"{spec['runner']} | {window} | {spec['sinks'] or '-'}"
    )
    if "error" in report:
        lines = [
            line
            for line in report["error"].splitlines()
            if "Error" in line or (spec.get("error") and spec["error"] in line)
        ]
        outcome = "refused as expected" if spec.get("error") else "**failed**"
        return f"| {name} | {config} | - | {outcome}: `{(lines or ['?'])[-1].strip()[:160]}` |"
    metrics = report["metrics"]
    drafts = metrics.get("vllm:spec_decode_num_drafts") or 0
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens") or 0
    length = 1 + accepted / drafts if drafts else float("nan")
    baseline = reports.get(spec["baseline"]) if spec["baseline"] else None
    same = (
        "-"
        if baseline is None
        else "yes"
        if baseline.get("tokens") == report["tokens"]
        else "**no**"
    )
    return (
        f"| {name} | {config} | {report.get('cudagraph_mode', '?')} | "
        f"{accepted} / {drafts} drafts, acceptance length {length:.2f}; identical to "
        f"baseline: {same}; init {report['init_s']:.0f} s |"
    )


def main(results_dir: str, status: str, seconds: str) -> None:
    out = Path(results_dir)
    reports = (
        json.loads((out / "engine-reports.json").read_text())
        if (out / "engine-reports.json").exists()
        else {}
    )
    log = (out / "pytest.log").read_text() if (out / "pytest.log").exists() else ""
    summary = [line for line in log.splitlines() if re.match(r"=+ .*(passed|failed|error)", line)]
    versions = _versions()
    lines = [
        "# GPU engine tier (tests_engine/ on a GPU build of vLLM)",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- device: {versions['device']}, driver {versions['driver']}",
        f"- versions: vLLM {versions['vllm']}, torch {versions['torch']}, "
        f"triton {versions['triton']}, Python {versions['python']}",
        f"- git commit: {os.environ.get('DSPARK_GIT_COMMIT', 'unknown')}",
        "- command: `bash scripts/gpu_engine_tier.sh` (after `scripts/stage_vllm_h200.sh`)",
        f"- pytest exit status {status}, {seconds} s in all (staging included): "
        f"{summary[-1].strip('= ') if summary else 'no summary'}",
        "",
        "| engine | method (draft) | backend | graphs | runner | W | sinks | cudagraph mode "
        "| result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(name, report, reports) for name, report in sorted(reports.items())]
    failed = [line for line in log.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if failed:
        lines += ["", "Failed tests:", ""] + [f"- `{line[:300]}`" for line in failed]
    (out / "gpu-engine-tier.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:4])
