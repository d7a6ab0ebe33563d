#!/usr/bin/env bash
# The acceptance study at the h200 scale on one CUDA GPU (what produced
# benchmarks/results/*-study-h200.*): trains the target and both drafts (a few
# minutes), then runs `dspark-compile study`. Writes study.json (after every
# cell), study.md, study.png (when matplotlib is there) and study.log to OUT_DIR.
# Usage: bash benchmarks/study_h200.sh [OUT_DIR] [extra `study` options]
set -euo pipefail
out="${1:-study-h200}"
shift || true
mkdir -p "$out"
python="${PYTHON:-python3}"
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$python" -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$out/study.log"
"$python" -m dspark_compile study --scale h200 --out-dir "$out" \
  --checkpoint "${CHECKPOINT:-/tmp/dspark_study_h200.pt}" "$@" 2>&1 | tee -a "$out/study.log"
