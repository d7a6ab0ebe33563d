#!/usr/bin/env bash
# The SmolLM2 pair on one lent H200 (no package index, <= 64 MiB per call, the machine goes
# back 30 s after a call): six calls issued back to back on one warm machine.
#
# Here, once:  bash ../shared/device/stage-vllm-h200.sh .vllm-h200   (vLLM 0.26.0, two parts;
#              put the gguf wheel in .vllm-h200/b/wheels/), then split the GGUF that
#              benchmarks/smollm2.py cached into .smol/ga/gguf.part0 and .smol/gb/gguf.part1
#              (head -c / tail -c at 49181216 bytes) and xz the prompts of
#              `smollm2_pair.py prepare` into .smol/gb/prompts.json.xz (every machine then
#              decodes the same prompts).
# Calls (carry in brackets):
#   1 [.vllm-h200/a]  mkdir -p /tmp/parts && cp .vllm-h200/a/part00 /tmp/parts/
#   2 [.vllm-h200/b]  bash .vllm-h200/b/install.sh
#   3 [.smol/ga]      bash benchmarks/smollm2_h200.sh gguf0
#   4 [.smol/gb]      bash benchmarks/smollm2_h200.sh train     # ~5 min: target, both drafts
#   5 []              bash benchmarks/smollm2_h200.sh draft_model
#   6 []              bash benchmarks/smollm2_h200.sh eagle3
# PAIR (default /tmp/smol-pair) holds the checkpoints between calls; results go to $OUT.
# Our loop against vLLM, cell by cell, runs on CPU in fp32 on the returned weights
# (`smollm2_pair.py assemble`, then bench_engine.py --our-loop), not here: device time.
set -uo pipefail
stage=${1:?usage: smollm2_h200.sh gguf0|train|draft_model|eagle3 [bench args...]}
shift
PAIR=${PAIR:-/tmp/smol-pair}
OUT=${OUT:-./out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 SMOLLM2_CACHE=/tmp/smol-cache
keep_logs() {  # the engines' logs of a bench run, as one file
  tar -czf "$OUT/$1-logs.tgz" -C "$PAIR" "$1.work" 2>/dev/null || true
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
# The device's .git is the session's first snapshot, not the tree sent: log the sent tree's
# id (compare here with `git rev-parse COMMIT^{tree}`); results name that commit.
rm -f /tmp/sent.idx
echo "sent tree: $(GIT_INDEX_FILE=/tmp/sent.idx git add -A . 2>/dev/null &&
  GIT_INDEX_FILE=/tmp/sent.idx git write-tree 2>/dev/null || echo unknown)"
case "$stage" in
  gguf0)
    mkdir -p /tmp/parts && cp .smol/ga/gguf.part0 /tmp/parts/ && ls -la /tmp/parts ;;
  train)
    mkdir -p /tmp/smol && cat /tmp/parts/gguf.part0 .smol/gb/gguf.part1 \
      > /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
    xz -dc .smol/gb/prompts.json.xz > /tmp/smol/prompts.json || exit 1
    "$PY" benchmarks/smollm2_pair.py prepare --pair "$PAIR" \
      --gguf /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf --prompts /tmp/smol/prompts.json \
      2>&1 | tee "$OUT/train.log"
    timeout 360 "$PY" benchmarks/smollm2_pair.py train --pair "$PAIR" --device cuda \
      --time-budget "${TRAIN_BUDGET:-200}" 2>&1 | tee -a "$OUT/train.log"
    cp "$PAIR/train_report.json" "$OUT/" && cp -r "$PAIR/weights" "$OUT/" ;;
  draft_model|eagle3)
    base=()
    [ "$stage" = eagle3 ] && [ -f "$PAIR/bench-draft_model.json" ] &&
      base=(--baseline "$PAIR/bench-draft_model.json")
    settings=${SETTINGS:-nospec,off,w1x,w2x}
    timeout "${BENCH_TIMEOUT:-590}" "$PY" benchmarks/bench_engine.py --pair "$PAIR" --out "$PAIR/bench-$stage.json" \
      --families "$stage" --settings "$settings" --repeats 4 "${base[@]}" \
      --max-seconds "${MAX_SECONDS:-470}" "$@" 2>&1 | tee "$OUT/bench-$stage.log"
    cp "$PAIR"/bench-"$stage".{json,md,png} "$OUT/" 2>/dev/null; keep_logs "bench-$stage" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
