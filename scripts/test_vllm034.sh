#!/usr/bin/env bash
# The unit tier (tests/) against vLLM 0.34.0 (torch 2.14.0, CPU) in .venv-vllm034/,
# outside CI (the venv is ~9 GB): CI and scripts/test.sh run the unit tier on the
# vllm of requirements/constraints.txt only. Extra arguments go to pytest (default:
# tests/; e.g. `bash scripts/test_vllm034.sh tests/test_vllm_kv_memory.py`).
# Pinned by requirements/constraints-vllm034.txt (a `pip freeze`), installed with
# --no-deps: vllm 0.34.0 requires flashinfer-python==0.7.3, which the package index
# does not serve, so the lock carries 0.7.2.post1 (that of vLLM 0.33.0; the unit
# tier runs no FlashInfer kernel). First run: ~5 minutes, ~9 GB. Re-running is
# cheap: a stamp keyed on the lock and pyproject.toml skips pip.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-vllm034"
lock="$root/requirements/constraints-vllm034.txt"
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh"
ensure_venv test-vllm034 "$venv"
stamp="$(install_stamp "$venv" vllm034 "$root/pyproject.toml" "$lock")"
if [ ! -f "$stamp" ]; then
  echo "[test-vllm034] installing vllm==0.34.0 and dspark-compile into $venv (first run: several minutes, ~9 GB)"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-deps)
  "${pip[@]}" -r "$lock"
  "${pip[@]}" -e "$root"
  "$venv/bin/python" -c "import vllm, dspark_compile_vllm; assert vllm.__version__.startswith('0.34.')"
  touch "$stamp"
fi
cd "$root"
set +e
"$venv/bin/python" -m pytest -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit "$status"
