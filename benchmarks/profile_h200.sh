#!/usr/bin/env bash
# Nsight Compute reports of our CUDA kernels at benchmark size (benchmarks/profile_kernels.py).
# Usage: bash benchmarks/profile_h200.sh OUT_DIR [case ...]   (default: every case)
# Per case: OUT_DIR/<case>.ncu-rep, <case>-details.txt (sections), <case>-raw.csv (all
# metrics), <case>-sass.csv (per-instruction stall samples, where this ncu prints them);
# everything also packed as OUT_DIR.tgz (one file to fetch from a lent machine).
set -uo pipefail
out="${1:?usage: profile_h200.sh OUT_DIR [case ...]}"
shift
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(decode-window decode-full block16 mla markov)
mkdir -p "$out"
ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
[ -n "$ncu_bin" ] || { echo "no ncu on this machine" >&2; exit 2; }
python="${PYTHON:-python3}"
for case in "${cases[@]}"; do
  case "$case" in
    mla) kernel=_grouped_sparse_mla_kernel ;;
    mla-gluon|mla-gluon-noloads) kernel=_gluon_sparse_mla_kernel ;;
    markov|markov-greedy) kernel=_markov_step_kernel ;;
    *) kernel=_paged_attention_kernel ;;
  esac
  echo "[$(date -u +%H:%M:%S)] profiling $case ($kernel)"
  "$ncu_bin" --set full --import-source yes --clock-control none -k "regex:^${kernel}$" \
    --launch-skip 2 --launch-count 1 -f -o "$out/$case" \
    "$python" benchmarks/profile_kernels.py "$case" > "$out/$case-ncu.log" 2>&1 \
    || { echo "  ncu failed for $case:"; tail -5 "$out/$case-ncu.log"; continue; }
  "$ncu_bin" -i "$out/$case.ncu-rep" --page details > "$out/$case-details.txt" 2>&1
  "$ncu_bin" -i "$out/$case.ncu-rep" --page raw --csv > "$out/$case-raw.csv" 2>&1
  "$ncu_bin" -i "$out/$case.ncu-rep" --page source --csv --print-source sass \
    > "$out/$case-sass.csv" 2>&1 || true
  grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued Instruction|Issue Slots Busy|Dynamic Shared Memory Per Block|L2 Hit Rate|Executed Ipc Active)" \
    "$out/$case-details.txt" | sed 's/^ */  /'
done
tar czf "${out%/}.tgz" -C "$(dirname "${out%/}")" "$(basename "${out%/}")"
echo "[$(date -u +%H:%M:%S)] reports packed in ${out%/}.tgz"
