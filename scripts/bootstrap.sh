#!/usr/bin/env bash
# Create .venv/ in the repo root (if missing) and install dspark-compile with the
# given extras (comma separated, may be empty) under requirements/constraints.txt.
# Re-running is cheap: a stamp keyed on the extras and the lock skips pip.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"
venv="$root/.venv"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating $venv with $("$python" --version)"
  "$python" -m venv "$venv"
fi
key="$(cat "$root/pyproject.toml" "$root/requirements/constraints.txt" | sha256sum | cut -c1-16)"
stamp="$venv/.dspark-installed-${extras:-core}-$key"
if [ ! -f "$stamp" ]; then
  spec="$root"
  [ -n "$extras" ] && spec="$root[$extras]"
  echo "[bootstrap] installing dspark-compile${extras:+[$extras]} into .venv (first run: several minutes, several GB)"
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on \
    -c "$root/requirements/constraints.txt" -e "$spec"
  touch "$stamp"
fi
