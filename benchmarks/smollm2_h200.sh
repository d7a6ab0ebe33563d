#!/usr/bin/env bash
# The SmolLM2 pair on one lent GPU, H100 or H200 (no package index, <= 64 MiB per call, the machine goes
# back 30 s after a call): six calls issued back to back on one warm machine.
#
# Here, once:  STAGE_EXTRA_WHEELS="gguf==0.19.0" bash scripts/stage_vllm_h200.sh   (vLLM 0.26.0
#              and the gguf wheel, two parts); then split the GGUF that benchmarks/smollm2.py
#              cached into .smol/ga/gguf.part0 and .smol/gb/gguf.part1 (head -c / tail -c at
#              49181216 bytes) and xz the prompts of `smollm2_pair.py prepare` into
#              .smol/gb/prompts.json.xz (every machine then decodes the same prompts).
#              Each part plus the tracked tree must stay under a call's 64 MiB.
# Calls (carry in brackets), issued back to back on one warm machine:
#   1 [.vllm-h200/a]  mkdir -p /tmp/parts && cp .vllm-h200/a/part00 /tmp/parts/
#   2 [.vllm-h200/b]  bash .vllm-h200/b/install.sh
#   3 [.smol/ga]      bash benchmarks/smollm2_h200.sh gguf0
#   4 [.smol/gb]      bash benchmarks/smollm2_h200.sh train     # ~5 min: target, both drafts
#   5 []              bash benchmarks/smollm2_h200.sh sweep t0 --temperatures 0
#   6 []              bash benchmarks/smollm2_h200.sh sweep t1 --temperatures 1
# A sweep runs both drafts' engines side by side (bench_engine.py --side-by-side: all start
# at once, each cell runs on every engine in turn), so every ratio in it comes from cells
# timed in one invocation; extra arguments go to bench_engine.py.
# PAIR (default /tmp/smol-pair) holds the checkpoints between calls; results go to $OUT.
# Our loop against vLLM, cell by cell, runs on CPU in fp32 on the returned weights
# (`smollm2_pair.py assemble`, then bench_engine.py --our-loop), not here: device time.
set -uo pipefail
stage=${1:?usage: smollm2_h200.sh gguf0|train|sweep NAME [bench_engine.py args...]}
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
  sweep)
    name=${1:?usage: smollm2_h200.sh sweep NAME [bench_engine.py args...]}
    shift
    # seven engines compile at once: a few Inductor workers each
    export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}
    timeout "${BENCH_TIMEOUT:-585}" "$PY" benchmarks/bench_engine.py --pair "$PAIR" \
      --out "$PAIR/bench-$name.json" --families draft_model,eagle3 \
      --settings "${SETTINGS:-nospec,off,w1x,w2x}" --repeats 4 --batches 1,32 \
      --batched-contexts 512,2048,8192 --side-by-side --kv-cache-gib "${KV_GIB:-6.5}" \
      --max-seconds "${MAX_SECONDS:-555}" "$@" 2>&1 | tee "$OUT/bench-$name.log"
    cp "$PAIR"/bench-"$name".{json,md,png} "$OUT/" 2>/dev/null; keep_logs "bench-$name" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
