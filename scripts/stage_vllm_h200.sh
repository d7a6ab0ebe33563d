#!/usr/bin/env bash
# Stage vLLM 0.26.0 (the newest release pinned to torch 2.11.0, the H200 image's torch) for a
# device that has no package index, plus this project's wheel. Run HERE, from the repo root:
#
#   bash scripts/stage_vllm_h200.sh            # writes .vllm-h200/ (ignored by git; ~2 min, ~95 MiB)
#
# One device call carries at most 64 MiB, so the payload (vLLM and the dependencies the image
# lacks, requirements/vllm-0.26.0-h200-deps.txt, minus what an H200 never loads: FlashAttention 2,
# MoE and Blackwell kernels, the Rust router) is xz-packed and split in two parts:
#   .vllm-h200/a/part00                   call 1 carries it and copies it out of the repo (an
#                                         ignored path a later call does not carry is removed):
#                                           mkdir -p /tmp/parts && cp .vllm-h200/a/part00 /tmp/parts/
#   .vllm-h200/b/{part01,wheels/,install.sh}  call 2 (and later calls) carry it; then
#                                           bash scripts/gpu_engine_tier.sh
#                                         unpacks vLLM into /tmp/site, installs the wheels and runs
#                                         the GPU engine tier; for anything else that needs vLLM
#                                         (kv_capacity.py, bench_engine.py, smollm2_h200.sh):
#                                           bash .vllm-h200/b/install.sh
#                                           export PYTHONPATH=$PWD:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
# Re-running rebuilds only the project's wheel (and the extra wheels) when the payload is there.
# STAGE_EXTRA_WHEELS="gguf==0.19.0" adds pure-Python wheels (no dependencies) to wheels/, e.g. the
# gguf reader benchmarks/smollm2_h200.sh needs; scripts/install_vllm_h200.sh installs them all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.vllm-h200"
cd "$root"
grep -qx '/.vllm-h200/' .git/info/exclude 2>/dev/null || echo '/.vllm-h200/' >> .git/info/exclude
if [ ! -f "$dir/a/part00" ] || [ ! -f "$dir/b/part01" ]; then
  work=$(mktemp -d -t vllm-h200.XXXX)
  plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
  for tag in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
             manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    plat+=(--platform "${tag}_x86_64")
  done
  echo "[stage] downloading vllm 0.26.0 and its missing dependencies"
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/whl" vllm==0.26.0 \
      -r <(grep -v '^#' requirements/vllm-0.26.0-h200-deps.txt)
  mkdir -p "$work/site"
  for w in "$work"/whl/*.whl; do python3 -m zipfile -e "$w" "$work/site" >/dev/null; done
  (
    cd "$work/site"
    rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs
    rm -rf vllm/third_party/fmha_sm100 vllm/third_party/deep_gemm/include \
           vllm/entrypoints/serve/instrumentator/static
    find . -name '_C.cpython-31[0134]-*.so' -delete
    find . -name '__pycache__' -prune -exec rm -rf {} +
    echo "[stage] packing $(du -sh . | cut -f1) with xz (a few minutes on 2 cores)"
    tar -cf - . | xz -T0 -6 > "$work/payload.tar.xz"
  )
  rm -rf "$dir"; mkdir -p "$dir/a" "$dir/b"
  # Each call also carries the working tree (~15 MB): part00 + tree must stay under 64 MiB
  # (67,108,864 bytes), and so must part01 + wheels + tree: two equal halves leave the most room.
  split -n 2 -d "$work/payload.tar.xz" "$work/part"
  [ "$(ls "$work"/part* | wc -l)" -eq 2 ] || { echo "[stage] expected 2 parts"; exit 1; }
  tree_bytes=$(git -C "$root" ls-files -z | (cd "$root" && xargs -0 du -cb 2>/dev/null) | tail -1 | cut -f1)
  for part in "$work/part00" "$work/part01"; do
    total=$(( $(stat -c %s "$part") + tree_bytes + 1048576 ))
    [ "$total" -lt 67108864 ] || echo "[stage] WARNING: $(basename "$part") + the tree is $total bytes: over a call's 64 MiB"
  done
  mv "$work/part00" "$dir/a/"; mv "$work/part01" "$dir/b/"
  rm -rf "$work"
fi
rm -rf "$dir/b/wheels"; mkdir -p "$dir/b/wheels"
echo "[stage] building the dspark-compile wheel"
python3 -m pip wheel -q --no-deps -w "$dir/b/wheels" "$root"
for spec in ${STAGE_EXTRA_WHEELS:-}; do
  echo "[stage] adding the wheel of $spec"
  out=$(python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/b/wheels" "$spec" 2>&1) ||
    { echo "$out" >&2; echo "[stage] STAGE_EXTRA_WHEELS: could not download $spec" >&2; exit 1; }
done
cp "$root/scripts/install_vllm_h200.sh" "$dir/b/install.sh"  # `bash .vllm-h200/b/install.sh` works too
du -sh "$dir/a" "$dir/b"
echo "[stage] done: call 1 carries .vllm-h200/a, call 2 carries .vllm-h200/b (see this script's header)"
