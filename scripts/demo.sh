#!/usr/bin/env bash
# The main job: the quickstart demo on the built-in reference draft (CPU by default).
# Extra arguments go to examples/quickstart.py (see --help).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" ""
cd "$root"
exec .venv/bin/python examples/quickstart.py "$@"
