#!/usr/bin/env bash
# ON the GPU machine, from the repo root, in a call that carries .vllm-h200/b (after call 1 copied
# .vllm-h200/a/part00 to /tmp/parts; scripts/stage_vllm_h200.sh's header): unpack vLLM 0.26.0 into
# /tmp/site (once per machine) and install every wheel of .vllm-h200/b/wheels/ there (the project's,
# and any STAGE_EXTRA_WHEELS). Then, in the same or a later call:
#
#   export PYTHONPATH=$PWD:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
#
# (scripts/gpu_engine_tier.sh does the same itself before the engine tier.)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# scripts/install_vllm_h200.sh, or its copy .vllm-h200/b/install.sh (stage_vllm_h200.sh writes it)
if [ -f "$here/part01" ]; then stage="$here"; else stage="$here/../.vllm-h200/b"; fi
if [ ! -d /tmp/site/vllm ]; then
  [ -f /tmp/parts/part00 ] || { echo "[install] /tmp/parts/part00 missing: run call 1 first" >&2; exit 2; }
  [ -f "$stage/part01" ] || { echo "[install] $stage/part01 missing: carry .vllm-h200/b" >&2; exit 2; }
  mkdir -p /tmp/site
  cat /tmp/parts/part00 "$stage/part01" | xz -d | tar -x -C /tmp/site
fi
out=$(python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
    "$stage"/wheels/*.whl 2>&1) || { echo "$out" >&2; echo "[install] installing the wheels failed" >&2; exit 1; }
echo "$out" | grep -v WARNING || true
PYTHONPATH="$PWD:/tmp/site" python3 -c "import vllm, torch; print('[install] vllm', vllm.__version__, 'torch', torch.__version__)"
