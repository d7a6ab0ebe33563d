#!/usr/bin/env bash
# Every benchmark behind docs/performance.md's GPU tables, in one call on a lent GPU:
#
#   bash benchmarks/perf_table_gpu.sh [BUDGET_SECONDS]     # default 540 (a call allows 600)
#   PERF_STEPS="peer-attention draft-window" bash benchmarks/perf_table_gpu.sh 200   # some steps
#
# The steps run one after another, each under its own time limit and all within the budget
# (a step that no longer fits is skipped and says so), so the results are always packed:
# $OUT/perf-table.tgz holds one folder per step (its results.md / .json where the script
# writes them, and its full log); $OUT/perf-table-log.txt is this script's own log.
set -uo pipefail
budget=${1:-540}
OUT=${OUT:-./out}
work=/tmp/perf-table
rm -rf "$work" && mkdir -p "$work" "$OUT"
start=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$OUT/perf-table-log.txt"
say() { echo "[perf $(date -u +%H:%M:%S)] $*" | tee -a "$log"; }
# The device's .git is the session's first snapshot, not the tree sent: log the sent tree's id
# (compare with `git rev-parse COMMIT^{tree}` where the commit was made).
rm -f /tmp/perf-sent.idx
say "sent tree: $(GIT_INDEX_FILE=/tmp/perf-sent.idx git add -A . 2>/dev/null &&
  GIT_INDEX_FILE=/tmp/perf-sent.idx git write-tree 2>/dev/null || echo unknown)"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "$(python3 -c 'import sys, torch, triton; print("torch", torch.__version__, "triton",
  triton.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])')"

# step NAME LIMIT CMD...: CMD --out WORK/NAME, its output in WORK/NAME/log.txt
step() {
  local name=$1 limit=$2 left rc t0
  shift 2
  if [ -n "${PERF_STEPS:-}" ] && [[ " $PERF_STEPS " != *" $name "* ]]; then
    say "$name: not in PERF_STEPS"
    return
  fi
  left=$((budget - ($(date +%s) - start) - 20))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 30 ]; then
    say "$name: skipped (budget of ${budget} s spent)"
    return
  fi
  mkdir -p "$work/$name"
  say "$name (limit ${limit} s): $*"
  t0=$(date +%s)
  timeout "$limit" "$@" --out "$work/$name" > "$work/$name/log.txt" 2>&1
  rc=$?
  say "$name: exit $rc in $(($(date +%s) - t0)) s$([ "$rc" = 124 ] && echo ' (time limit)')"
  grep -E 'speedup|windowed|SDPA|ceiling|gluon|grouped|head in|fused|per layer|N=4|OK|FAIL|rror' \
    "$work/$name/log.txt" | tail -n 14 | sed 's/^/    /' | tee -a "$log"
}

step peer-attention 170 python3 benchmarks/bench_peer_attention.py --layers 4
step draft-window 200 python3 benchmarks/bench_draft_window.py
step dspark-kernels 130 python3 benchmarks/bench_dspark_kernels.py
step mla-copy-bound 60 python3 benchmarks/bench_mla_copy_bound.py
step peer-attention-read 120 python3 benchmarks/bench_peer_attention.py \
  --cases 32x32768x1,32x131072x1 --layers 4 --flush read
tar -czf "$OUT/perf-table.tgz" -C "$work" .
say "packed $OUT/perf-table.tgz in $(($(date +%s) - start)) s"
