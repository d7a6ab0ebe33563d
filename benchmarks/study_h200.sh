#!/usr/bin/env bash
# The acceptance study at the h200 scale on one CUDA GPU (what produced
# benchmarks/results/2026-11-30/*-study-h200.*): trains the target and both drafts (a few
# minutes), then runs `python -m dspark_research study` (the checkout's research
# package). Writes study.json (after every cell), study.md, study.png (when matplotlib
# is there) and study.log to OUT_DIR.
# Usage: bash benchmarks/study_h200.sh [OUT_DIR] [extra `study` options]
#
# SETTINGS (study --settings keys) picks the settings; the default is the
# attention-sink comparison of issue 13: the window of the drafts' training
# context alone (w1x) and with sinks of 1 and 4 KV blocks (w1x+s1b, w1x+s4b),
# 2 families x 3 settings x 5 contexts = 30 cells, all windowed (~4-5 s each on
# the H200 in the last runs, so ~2.5 min + ~4.5 min of training with
# --train-time-budget 80 and setup: ~7 min). SETTINGS=all runs every setting
# (no window, 1x, 2x, 4x and both sink settings: 60 cells, ~12 min).
set -euo pipefail
out="${1:-study-h200}"
shift || true
settings="${SETTINGS:-w1x w1x+s1b w1x+s4b}"
settings_args=()
if [ "$settings" != "all" ]; then
  # shellcheck disable=SC2206
  settings_args=(--settings $settings)
fi
mkdir -p "$out"
python="${PYTHON:-python3}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"  # dspark_research: not in the wheel
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$python" -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$out/study.log"
"$python" -m dspark_research study --scale h200 --out-dir "$out" \
  --checkpoint "${CHECKPOINT:-/tmp/dspark_study_h200.pt}" ${settings_args[@]+"${settings_args[@]}"} "$@" 2>&1 \
  | tee -a "$out/study.log"
