#!/usr/bin/env bash
# The GPU engine tier: tests_engine/ against vLLM 0.26.0 on an NVIDIA GPU (the H200), every
# method, backend, CUDA-graph mode and runner conftest.py's gpu_engines() lists. Runs ON the
# device, from the repo root, after scripts/stage_vllm_h200.sh staged .vllm-h200 here and call 1
# copied part00 to /tmp/parts (that script's header):
#
#   DSPARK_GIT_COMMIT=<commit> bash scripts/gpu_engine_tier.sh [RESULTS_DIR]
#
# Unpacks vLLM into /tmp/site (once per machine), installs the project's wheel there, runs the
# tier (four engines at a time) and writes RESULTS_DIR (default $OUT, else /tmp/gpu-engine-tier):
# gpu-engine-tier.md (date, device, versions, commit, per-engine results), the engine reports as
# JSON, the pytest log and engine-logs.tgz (every engine's own log and report). Extra pytest
# arguments: DSPARK_PYTEST_ARGS. DSPARK_TIER_TIMEOUT (seconds, default none) stops pytest in
# time for the report and the logs to be written anyway (a device call allows 600 s).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-${OUT:-/tmp/gpu-engine-tier}}"
mkdir -p "$out"
cd "$root"
stage="$root/.vllm-h200/b"
started=$(date +%s)
if [ ! -d /tmp/site/vllm ]; then
  [ -f /tmp/parts/part00 ] || { echo "[gpu-tier] /tmp/parts/part00 missing: run call 1 first"; exit 2; }
  mkdir -p /tmp/site
  cat /tmp/parts/part00 "$stage/part01" | xz -d | tar -x -C /tmp/site || exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
    "$stage"/wheels/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 DSPARK_ENGINE_DEVICE=cuda
export DSPARK_ENGINE_JOBS="${DSPARK_ENGINE_JOBS:-4}" DSPARK_ENGINE_REPORTS="$out/engine-reports.json"
python3 -c "import vllm, torch, dspark_compile; print('[gpu-tier] vllm', vllm.__version__, 'torch', torch.__version__, 'dspark_compile', dspark_compile.__file__)" || exit 2
echo "[gpu-tier] staged in $(( $(date +%s) - started )) s"
# shellcheck disable=SC2086
basetemp=/tmp/gpu-engine-tier-tmp
timeout "${DSPARK_TIER_TIMEOUT:-0}" python3 -m pytest -p no:cacheprovider -v -rA \
    --basetemp "$basetemp" tests_engine/test_engine.py ${DSPARK_PYTEST_ARGS:-} 2>&1 \
    | tee "$out/pytest.log"
status=${PIPESTATUS[0]}
[ "$status" = 124 ] && echo "[gpu-tier] pytest stopped at DSPARK_TIER_TIMEOUT=${DSPARK_TIER_TIMEOUT} s" \
    | tee -a "$out/pytest.log"
(cd "$basetemp" && find . -name '*.log' -o -name '*.json' | tar -czf "$out/engine-logs.tgz" -T -)
python3 tests_engine/gpu_report.py "$out" "$status" "$(( $(date +%s) - started ))"
exit "$status"
