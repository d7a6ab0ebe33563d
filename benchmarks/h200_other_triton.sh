#!/usr/bin/env bash
# The GPU kernel tests and the DSpark kernel benchmark under a triton other than the
# machine's own, e.g. 3.8 (the pinned torch 2.14's) on a machine that has torch 2.11.
# Usage: bash benchmarks/h200_other_triton.sh TRITON_TAR OUT_DIR [suite_timeout_s]
#   TRITON_TAR  a tar (.tar.xz) holding a `triton/` package built for this Python
#   OUT_DIR     gets versions.txt, kernel-tests.txt, bench.{md,json,log}, suite.txt
# The Gluon sparse MLA kernel is forced on (DSPARK_MLA_GLUON=1) so that its tests and
# the benchmark run it whatever VERIFIED_TRITON says. Last, the whole suite runs for at
# most suite_timeout_s (default 300): torch's own Inductor may not support that triton.
#
# Building TRITON_TAR for the H200 (Python 3.12) on any x86-64 machine with pip and strip
# (49 MB for triton 3.8.0, under the device tool's 64 MiB carry limit):
#   pip download triton==3.8.0 --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 -d /tmp/t38
#   cd /tmp/t38 && python3 -m zipfile -e triton-3.8.0-*.whl x && cd x
#   rm -rf triton/backends/nvidia/lib/cupti* triton/backends/nvidia/bin/ptxas-blackwell \
#     triton/backends/nvidia/bin/nvdisasm triton/_C/libproton.so triton/instrumentation/*.so
#   strip --strip-unneeded triton/_C/libtriton.so
#   tar cf - triton | xz -T0 -9 > triton38-cp312-min.tar.xz
set -uo pipefail
tar_path="${1:?usage: h200_other_triton.sh TRITON_TAR OUT_DIR [suite_timeout_s]}"
out="${2:?usage: h200_other_triton.sh TRITON_TAR OUT_DIR [suite_timeout_s]}"
suite_timeout="${3:-300}"
site="$PWD/.other-triton"   # not /tmp: its bin/ tools must be executable
mkdir -p "$site" "$out"
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
stamp "unpacking $tar_path"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  "$tar_path" "$site" || exit 2
chmod +x "$site"/triton/backends/nvidia/bin/* 2>/dev/null
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=/tmp/other-triton-cache DSPARK_MLA_GLUON=1
python3 - <<'PY' | tee "$out/versions.txt"
import platform, subprocess, torch, triton
print("python", platform.python_version(), "torch", torch.__version__, "triton",
      triton.__version__, "from", triton.__file__)
print(torch.cuda.get_device_name(), subprocess.run(
    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
    capture_output=True, text=True).stdout.strip())
PY
stamp "kernel tests"
python3 -m pytest -q -n 8 -p no:cacheprovider -rfEs tests/test_sparse_mla_gluon.py \
  tests/test_triton_kernels.py tests/test_dspark_kernels.py tests/test_markov_sampling.py \
  tests/test_markov_head_sampling.py \
  tests/test_paged_attention_ops.py tests/test_sparse_mla_ops.py tests/test_sink_kernels.py \
  tests/test_in_kernel_window.py tests/test_per_token_window.py \
  > "$out/kernel-tests.txt" 2>&1
tail -25 "$out/kernel-tests.txt"
stamp "benchmark: ceiling, MLA (Gluon forced on), Markov"
python3 benchmarks/bench_dspark_kernels.py --sections ceiling,mla,markov \
  --out "$out/bench" > "$out/bench.log" 2>&1
tail -30 "$out/bench.log"
if [ "$suite_timeout" -gt 0 ]; then
  stamp "whole suite (at most ${suite_timeout}s)"
  timeout "$suite_timeout" python3 -m pytest -q -n 12 -p no:cacheprovider -rfEs tests/ \
    > "$out/suite.txt" 2>&1
  echo "suite rc=$?"; tail -40 "$out/suite.txt"
fi
stamp done
