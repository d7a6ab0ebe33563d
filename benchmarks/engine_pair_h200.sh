#!/usr/bin/env bash
# Issue 31 on the H200, in four calls of at most 10 minutes on one warm machine:
#
#   bash benchmarks/engine_pair_h200.sh train        # ~6-7 min: train + export to $PAIR
#   bash benchmarks/engine_pair_h200.sh draft_model  # ~9 min: nospec + draft_model engines
#   bash benchmarks/engine_pair_h200.sh eagle        # ~7 min: eagle engines (+ our loop)
#   bash benchmarks/engine_pair_h200.sh eagle3       # eagle3 engines (V1 runner), off/w1x/w2x/native
#
# PAIR (default /tmp/pair) holds the checkpoints between calls; OUT (default ./out)
# gets copies of every result and log. Extra arguments go to the Python script.
# vLLM must be importable (e.g. PYTHONPATH=/tmp/site); the repo is the cwd.
set -uo pipefail
stage=${1:?usage: engine_pair_h200.sh train|draft_model|eagle|eagle3 [args...]}
shift
PAIR=${PAIR:-/tmp/pair}
OUT=${OUT:-./out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
case "$stage" in
  train)
    timeout 570 "$PY" benchmarks/train_engine_pair.py --out "$PAIR" --device cuda \
      --scale h200 --time-budget 330 "$@" 2>&1 | tee "$OUT/train.log"
    cp -r "$PAIR/train_report.json" "$PAIR/prompts.json" "$OUT/" 2>/dev/null
    for m in target draft eagle eagle3; do mkdir -p "$OUT/$m"; cp "$PAIR/$m/config.json" "$OUT/$m/"; done
    du -sh "$PAIR"/* ;;
  draft_model)
    timeout 590 "$PY" benchmarks/bench_engine.py --pair "$PAIR" --out "$PAIR/bench-draft_model.json" \
      --families draft_model --max-seconds 560 "$@" 2>&1 | tee "$OUT/bench-draft_model.log"
    cp "$PAIR"/bench-draft_model.{json,md} "$OUT/" 2>/dev/null
    cp -r "$PAIR/bench-draft_model.work" "$OUT/" 2>/dev/null ;;
  eagle)
    base=()
    [ -f "$PAIR/bench-draft_model.json" ] && base=(--baseline "$PAIR/bench-draft_model.json")
    timeout 590 "$PY" benchmarks/bench_engine.py --pair "$PAIR" --out "$PAIR/bench-eagle.json" \
      --families eagle "${base[@]}" --our-loop --max-seconds 560 "$@" 2>&1 | tee "$OUT/bench-eagle.log"
    cp "$PAIR"/bench-eagle.{json,md} "$OUT/" 2>/dev/null
    cp -r "$PAIR/bench-eagle.work" "$OUT/" 2>/dev/null ;;
  eagle3)
    base=()
    [ -f "$PAIR/bench-draft_model.json" ] && base=(--baseline "$PAIR/bench-draft_model.json")
    timeout 590 "$PY" benchmarks/bench_engine.py --pair "$PAIR" --out "$PAIR/bench-eagle3.json" \
      --families eagle3 "${base[@]}" --max-seconds 560 "$@" 2>&1 | tee "$OUT/bench-eagle3.log"
    cp "$PAIR"/bench-eagle3.{json,md} "$OUT/" 2>/dev/null
    cp -r "$PAIR/bench-eagle3.work" "$OUT/" 2>/dev/null ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
