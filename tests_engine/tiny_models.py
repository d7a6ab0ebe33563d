"""Tiny random-weight checkpoints built locally (no downloads) for engine tests.

``build_llama(path, num_layers, seed)``: a HF ``LlamaForCausalLM`` saved with
``transformers`` (safetensors, config.json). ``build_eagle3(path, target_path,
seed)``: an EAGLE3 draft in the checkpoint layout vLLM's
``Eagle3LlamaForCausalLM`` loads (``midlayer.*``, ``fc``, ``norm``,
``lm_head``); ``build_eagle(path, seed)``: an EAGLE draft in the layout of
vLLM's ``EagleLlamaForCausalLM`` (``fc`` over ``[embed, hidden]``, one layer);
``build_dflash(path, seed)``: a DFlash draft in the layout of vLLM's
``DFlashQwen3ForCausalLM`` (Qwen3 layer with q/k norms, ``fc`` over the
target's aux hidden states, non-causal). All drafts are for the 2-layer
target. No tokenizer: engines run with ``skip_tokenizer_init=True`` on token ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 512
HIDDEN = 128
HEADS = 4  # head_dim 32: CPU_ATTN supports multiples of 32; TP=2 splits heads
KV_HEADS = 2
INTERMEDIATE = 128
MAX_POSITIONS = 8192
AUX_LAYERS = [1, 2]  # EAGLE3: the 2-layer target's hidden states after layers 0 and 1


def llama_config(num_layers: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": num_layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.2,
    }


def build_llama(path: Path, num_layers: int, seed: int) -> Path:
    """Random ``LlamaForCausalLM`` (std 0.2 init: sharp, context-sensitive logits)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**llama_config(num_layers)))
    model.save_pretrained(path, safe_serialization=True)
    return path


def build_eagle3(path: Path, seed: int) -> Path:
    """Random one-layer EAGLE3 draft for the 2-layer target (full vocab, 2 aux hidden states)."""
    from safetensors.torch import save_file

    path = Path(path)
    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    config = llama_config(1)
    config["architectures"] = ["LlamaForCausalLMEagle3"]
    config["draft_vocab_size"] = VOCAB
    config["target_hidden_size"] = HIDDEN
    # Aux hidden states after target layers 0 and 1 (ids 1 and 2; id 0, the embedding
    # output, breaks vLLM 0.26's in-place functionalization pass on the target: the
    # embedding is donated to the first fused_add_rms_norm and then read again). vLLM
    # 0.26's V1 runner reads the ids from ``eagle_config``, its V2 runner only from
    # the top level: set both.
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": AUX_LAYERS}
    config["eagle_aux_hidden_state_layer_ids"] = AUX_LAYERS
    (path / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.2

    head_dim = HIDDEN // HEADS
    weights = {
        "fc.weight": rand(HIDDEN, len(AUX_LAYERS) * HIDDEN),
        "midlayer.hidden_norm.weight": torch.ones(HIDDEN),
        "midlayer.input_layernorm.weight": torch.ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": torch.ones(HIDDEN),
        "midlayer.self_attn.q_proj.weight": rand(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": rand(KV_HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": rand(KV_HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": rand(HIDDEN, HEADS * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE),
        "norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": rand(VOCAB, HIDDEN),
    }
    save_file(weights, str(path / "model.safetensors"))
    return path


def _layer_weights(prefix: str, rand, qkv_in: int, qk_norm: bool = False) -> dict:
    head_dim = HIDDEN // HEADS
    weights = {
        f"{prefix}.self_attn.q_proj.weight": rand(HEADS * head_dim, qkv_in),
        f"{prefix}.self_attn.k_proj.weight": rand(KV_HEADS * head_dim, qkv_in),
        f"{prefix}.self_attn.v_proj.weight": rand(KV_HEADS * head_dim, qkv_in),
        f"{prefix}.self_attn.o_proj.weight": rand(HIDDEN, HEADS * head_dim),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(HIDDEN),
        f"{prefix}.mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE),
    }
    if qk_norm:
        weights[f"{prefix}.self_attn.q_norm.weight"] = torch.ones(head_dim)
        weights[f"{prefix}.self_attn.k_norm.weight"] = torch.ones(head_dim)
    return weights


def _generator_rand(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return lambda *shape: torch.randn(*shape, generator=gen) * 0.2


def build_eagle(path: Path, seed: int) -> Path:
    """Random one-layer EAGLE (EAGLE-1) draft: ``fc: [embed, hidden] -> hidden``, then a
    Llama layer without input norm; embedding and ``lm_head`` shared with the target."""
    from safetensors.torch import save_file

    path = Path(path)
    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    config = llama_config(1)
    config["architectures"] = ["EagleLlamaForCausalLM"]
    (path / "config.json").write_text(json.dumps(config, indent=1))
    rand = _generator_rand(seed)
    weights = {"fc.weight": rand(HIDDEN, 2 * HIDDEN), **_layer_weights("layers.0", rand, HIDDEN)}
    save_file(weights, str(path / "model.safetensors"))
    return path


def build_dflash(path: Path, seed: int) -> Path:
    """Random one-layer DFlash draft (non-causal block attention over the target's aux
    hidden states after layers 0 and 1; mask token ``VOCAB - 1``)."""
    from safetensors.torch import save_file

    path = Path(path)
    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    config = llama_config(1)
    config.update(
        {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "target_hidden_size": HIDDEN,
            "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": [0, 1]},
        }
    )
    (path / "config.json").write_text(json.dumps(config, indent=1))
    rand = _generator_rand(seed)
    weights = {
        "fc.weight": rand(HIDDEN, 2 * HIDDEN),
        "hidden_norm.weight": torch.ones(HIDDEN),
        "norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": rand(VOCAB, HIDDEN),
        "layers.0.input_layernorm.weight": torch.ones(HIDDEN),
        **_layer_weights("layers.0", rand, HIDDEN, qk_norm=True),
    }
    save_file(weights, str(path / "model.safetensors"))
    return path
