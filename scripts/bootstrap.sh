#!/usr/bin/env bash
# Create .venv/ in the repo root (if missing) and install dspark-compile with the
# given extras (comma separated, may be empty) under requirements/constraints.txt.
# Re-running is cheap: a stamp keyed on the extras and the lock skips pip.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"
venv="$root/.venv"
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh"
ensure_venv bootstrap "$venv"
stamp="$(install_stamp "$venv" "${extras:-core}" "$root/pyproject.toml" \
  "$root/requirements/constraints.txt")"
if [ ! -f "$stamp" ]; then
  spec="$root"
  [ -n "$extras" ] && spec="$root[$extras]"
  echo "[bootstrap] installing dspark-compile${extras:+[$extras]} into .venv (first run: several minutes, several GB)"
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on \
    -c "$root/requirements/constraints.txt" -e "$spec"
  touch "$stamp"
fi
