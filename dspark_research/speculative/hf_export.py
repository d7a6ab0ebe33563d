"""The study's byte LMs as HF checkpoints that vLLM loads, and back.

:class:`~dspark_research.speculative.lm.TransformerLM` without features is exactly
HF ``LlamaForCausalLM`` (pre-norm RMSNorm, rotate-half RoPE with
``inv_freq = theta ** (-2i / head_dim)``, GQA, SiLU-gated MLP, no biases, untied
``lm_head``); :func:`llama_state_dict` renames and splits its fused ``qkv`` /
``gate_up`` weights (``tests/test_engine_pair.py`` checks the logits against
``transformers`` to 1e-5 in fp32).

The EAGLE draft is built in the layout of vLLM's ``EagleLlamaForCausalLM``
(``vllm/model_executor/models/llama_eagle.py``, the same in vLLM 0.26 and 0.33):
``fc(cat[embed(x), feature])``, Llama decoder layers whose first one has no
``input_layernorm``, **no final norm**, and the target's ``lm_head`` on the
result. :func:`vllm_eagle_lm` makes a ``TransformerLM`` with exactly that
structure (``layers[0].attn_norm`` and ``norm`` are identities), so the same
training code and speculative loop run it. The checkpoint holds ``fc.weight`` and
``layers.*`` only: vLLM shares the target's ``embed_tokens`` and ``lm_head`` with
an EAGLE draft whose checkpoint has none (the study trains them frozen copies of
the target's anyway).

``max_position_embeddings``: vLLM sizes a model's RoPE cos/sin cache from it and
caps the draft's ``max_model_len`` at it (``SpeculativeConfig.
_maybe_override_draft_max_model_len``, an info log, no error), but the V1
proposers never stop drafting past it: positions beyond it index past the RoPE
cache. The drafts are therefore written with ``max_position_embeddings`` = the
target's (plain RoPE has no length-dependent parameter, so this changes no
weight) and name their real training length in ``dspark_training_context``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from dspark_research.speculative.lm import LMConfig, TransformerLM

TRAINING_CONTEXT_KEY = "dspark_training_context"


def vllm_eagle_lm(cfg: LMConfig, seed: int = 0) -> TransformerLM:
    """An EAGLE-style ``TransformerLM`` (``cfg.feature_size == cfg.hidden_size``) in
    vLLM's ``EagleLlamaForCausalLM`` structure: no ``input_layernorm`` on layer 0,
    no final norm (its returned hidden is what ``lm_head`` reads, and what vLLM
    feeds back as the next feature)."""
    if cfg.feature_size != cfg.hidden_size:
        raise ValueError(
            f"feature_size={cfg.feature_size} is invalid: vLLM's EAGLE layout "
            f"needs feature_size == hidden_size ({cfg.hidden_size})"
        )
    model = TransformerLM(cfg, seed=seed)
    model.layers[0].attn_norm = nn.Identity()
    model.norm = nn.Identity()
    return model


def is_vllm_eagle(model: TransformerLM) -> bool:
    return model.cfg.feature_size > 0 and isinstance(model.norm, nn.Identity)


def llama_config(
    cfg: LMConfig,
    *,
    max_position_embeddings: int,
    training_context: Optional[int] = None,
    eagle: bool = False,
    extra: Optional[dict] = None,
) -> dict:
    """The HF ``config.json`` of ``cfg`` (a Llama; ``eagle``: vLLM's EAGLE draft,
    which vLLM names ``EagleLlamaForCausalLM`` from ``LlamaForCausalLM``)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": cfg.eps,
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": 0,
        "pad_token_id": None,
        "initializer_range": 0.02,
    }
    if training_context is not None:
        config[TRAINING_CONTEXT_KEY] = training_context
    if eagle:
        config["dspark_layout"] = (
            "vLLM EagleLlamaForCausalLM (method 'eagle'): fc, layers "
            "(layer 0 without input_layernorm), no final norm; "
            "embed_tokens and lm_head shared from the target"
        )
    config.update(extra or {})
    return config


def block_state(block, prefix: str) -> dict[str, torch.Tensor]:
    """HF Llama names (under ``prefix``) of a block's attention and MLP weights: any module
    with ``qkv``, ``o_proj``, ``mlp_norm``, ``gate_up``, ``down``, ``q_size``, ``kv_size``
    (a :class:`TransformerLM` layer, the EAGLE3 midlayer). Input norms are the caller's."""
    q, k, v = block.qkv.weight.split([block.q_size, block.kv_size, block.kv_size], dim=0)
    gate, up = block.gate_up.weight.chunk(2, dim=0)
    p = prefix
    return {
        p + "self_attn.q_proj.weight": q,
        p + "self_attn.k_proj.weight": k,
        p + "self_attn.v_proj.weight": v,
        p + "self_attn.o_proj.weight": block.o_proj.weight,
        p + "post_attention_layernorm.weight": block.mlp_norm.weight,
        p + "mlp.gate_proj.weight": gate,
        p + "mlp.up_proj.weight": up,
        p + "mlp.down_proj.weight": block.down.weight,
    }


def _layer_state(model: TransformerLM, prefix: str, skip_input_norm: bool) -> dict:
    out = {}
    for i, layer in enumerate(model.layers):
        p = f"{prefix}layers.{i}."
        if not (skip_input_norm and i == 0):
            out[p + "input_layernorm.weight"] = layer.attn_norm.weight
        out.update(block_state(layer, p))
    return out


def llama_state_dict(model: TransformerLM) -> dict[str, torch.Tensor]:
    """HF ``LlamaForCausalLM`` weights of a plain (feature-less) ``TransformerLM``."""
    if model.cfg.feature_size:
        raise ValueError(
            "llama_state_dict needs a plain LM (feature_size == 0); "
            "use eagle_state_dict for an EAGLE draft"
        )
    out = {
        "model.embed_tokens.weight": model.embed.weight,
        **_layer_state(model, "model.", skip_input_norm=False),
        "model.norm.weight": model.norm.weight,
        "lm_head.weight": model.lm_head.weight,
    }
    return {k: v.detach().float().cpu().contiguous() for k, v in out.items()}


def eagle_state_dict(model: TransformerLM) -> dict[str, torch.Tensor]:
    """vLLM ``EagleLlamaForCausalLM`` checkpoint weights (``fc``, ``layers.*``; vLLM
    prefixes ``model.`` itself and shares the target's embedding and ``lm_head``)."""
    if not is_vllm_eagle(model):
        raise ValueError("eagle_state_dict needs a model built by vllm_eagle_lm")
    out = {"fc.weight": model.feature_proj.weight, **_layer_state(model, "", skip_input_norm=True)}
    return {k: v.detach().float().cpu().contiguous() for k, v in out.items()}


def save_checkpoint(path: Path, state: dict[str, torch.Tensor], config: dict) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def export_llama(
    model: TransformerLM,
    path: Path,
    *,
    max_position_embeddings: int,
    training_context: int,
    extra: Optional[dict] = None,
) -> Path:
    return save_checkpoint(
        path,
        llama_state_dict(model),
        llama_config(
            model.cfg,
            max_position_embeddings=max_position_embeddings,
            training_context=training_context,
            extra=extra,
        ),
    )


def export_eagle(
    model: TransformerLM,
    path: Path,
    *,
    max_position_embeddings: int,
    training_context: int,
    extra: Optional[dict] = None,
) -> Path:
    return save_checkpoint(
        path,
        eagle_state_dict(model),
        llama_config(
            model.cfg,
            max_position_embeddings=max_position_embeddings,
            training_context=training_context,
            eagle=True,
            extra=extra,
        ),
    )


def config_of(config: dict, feature_size: int = 0) -> LMConfig:
    """The :class:`LMConfig` of a Llama ``config.json`` dict."""
    return LMConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        intermediate_size=config["intermediate_size"],
        feature_size=feature_size,
        rope_theta=float(config.get("rope_theta", 10000.0)),
        eps=float(config["rms_norm_eps"]),
    )


def read_checkpoint(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    path = Path(path)
    return json.loads((path / "config.json").read_text()), load_file(
        str(path / "model.safetensors")
    )


def load_block(block, state: dict[str, torch.Tensor], prefix: str) -> None:
    """Copy the tensors :func:`block_state` names from ``state`` into ``block``."""
    p = prefix
    block.qkv.weight.copy_(
        torch.cat([state[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], dim=0)
    )
    block.o_proj.weight.copy_(state[p + "self_attn.o_proj.weight"])
    block.mlp_norm.weight.copy_(state[p + "post_attention_layernorm.weight"])
    block.gate_up.weight.copy_(
        torch.cat([state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]], dim=0)
    )
    block.down.weight.copy_(state[p + "mlp.down_proj.weight"])


def _load_layers(model: TransformerLM, state: dict, prefix: str, skip_input_norm: bool) -> None:
    for i, layer in enumerate(model.layers):
        p = f"{prefix}layers.{i}."
        if not (skip_input_norm and i == 0):
            layer.attn_norm.weight.copy_(state[p + "input_layernorm.weight"])
        load_block(layer, state, p)


@torch.no_grad()
def load_llama(path: Path) -> TransformerLM:
    """A ``TransformerLM`` (eval, frozen) from a checkpoint :func:`export_llama` wrote."""
    config, state = read_checkpoint(path)
    model = TransformerLM(config_of(config))
    model.embed.weight.copy_(state["model.embed_tokens.weight"])
    _load_layers(model, state, "model.", skip_input_norm=False)
    model.norm.weight.copy_(state["model.norm.weight"])
    model.lm_head.weight.copy_(state["lm_head.weight"])
    return model.eval().requires_grad_(False)


@torch.no_grad()
def load_eagle(path: Path, target: TransformerLM) -> TransformerLM:
    """The EAGLE draft of :func:`export_eagle` with ``target``'s embedding and ``lm_head``
    (as vLLM shares them)."""
    config, state = read_checkpoint(path)
    model = vllm_eagle_lm(config_of(config, feature_size=config["hidden_size"]))
    model.feature_proj.weight.copy_(state["fc.weight"])
    _load_layers(model, state, "", skip_input_norm=True)
    model.embed.weight.copy_(target.embed.weight)
    model.lm_head.weight.copy_(target.lm_head.weight)
    return model.eval().requires_grad_(False)


def training_context(path: Path) -> Optional[int]:
    return json.loads((Path(path) / "config.json").read_text()).get(TRAINING_CONTEXT_KEY)
