#!/usr/bin/env bash
# The whole test suite (CPU; Triton kernels under TRITON_INTERPRET=1; real vLLM).
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" "test,vllm,study"
cd "$root"
set +e
.venv/bin/python -m pytest -n 2 --dist loadfile "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$status"
