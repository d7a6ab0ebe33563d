"""The trained pair's HF export (issue 31) and the engine benchmark's pure parts.

The export must be exact: ``TransformerLM`` and ``transformers``' ``LlamaForCausalLM``
on the exported checkpoint agree to 1e-5 in fp32; the EAGLE draft in vLLM's
``EagleLlamaForCausalLM`` structure agrees with the same computation built from
``transformers``' Llama decoder layer (vLLM's ``llama_eagle.py``: ``fc`` on
``[embed, feature]``, layer 0 without ``input_layernorm``, no final norm).
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark_research.speculative import hf_export
from dspark_research.speculative.lm import LMConfig, TransformerLM, shift_features

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

CFG = LMConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96
)

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
)
needs_safetensors = pytest.mark.skipif(
    importlib.util.find_spec("safetensors") is None, reason="safetensors is not installed"
)


def _perturbed(model):
    """Non-trivial norms and weights (the init's ones / small std would hide mistakes)."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


@needs_transformers
@needs_safetensors
@pytest.mark.parametrize("theta", [10000.0, 500.0])
def test_llama_export_matches_transformers_logits(tmp_path, theta):
    from transformers import LlamaForCausalLM

    cfg = LMConfig(**{**CFG.__dict__, "rope_theta": theta})
    model = _perturbed(TransformerLM(cfg, seed=3)).eval()
    hf_export.export_llama(model, tmp_path / "m", max_position_embeddings=512, training_context=64)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config[hf_export.TRAINING_CONTEXT_KEY] == 64
    assert config["max_position_embeddings"] == 512
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 300), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model.forward_dense(tokens)[0]
        theirs = hf(tokens).logits.float()
    assert ours.abs().max() > 0.1
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    reloaded = hf_export.load_llama(tmp_path / "m")
    with torch.no_grad():
        torch.testing.assert_close(reloaded.forward_dense(tokens)[0], ours, atol=0, rtol=0)


@needs_transformers
@needs_safetensors
def test_eagle_export_matches_vllm_layout_built_from_transformers(tmp_path):
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    target = _perturbed(TransformerLM(CFG, seed=0)).eval()
    eagle_cfg = LMConfig(**{**CFG.__dict__, "num_layers": 1, "feature_size": CFG.hidden_size})
    eagle = _perturbed(hf_export.vllm_eagle_lm(eagle_cfg, seed=2)).eval()
    from dspark_research.speculative.training import tie_eagle_to_target

    tie_eagle_to_target(eagle, target)
    hf_export.export_eagle(eagle, tmp_path / "e", max_position_embeddings=512, training_context=64)
    state = load_file(str(tmp_path / "e" / "model.safetensors"))
    assert "fc.weight" in state and not any(
        k.startswith(("model.", "lm_head", "embed")) for k in state
    )
    assert "layers.0.input_layernorm.weight" not in state
    config = LlamaConfig(**json.loads((tmp_path / "e" / "config.json").read_text()))
    config._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    layer.input_layernorm = torch.nn.Identity()  # vLLM: disable_input_layernorm
    layer.load_state_dict(
        {k[len("layers.0.") :]: v for k, v in state.items() if k.startswith("layers.0.")},
        strict=False,
    )
    rope = LlamaRotaryEmbedding(config)
    tokens = torch.randint(0, 256, (1, 120), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, features = target.forward_dense(tokens)
        features = shift_features(features)
        ours_logits, ours_hidden = eagle.forward_dense(tokens, features)
        x = torch.cat([target.embed(tokens), features], dim=-1) @ state["fc.weight"].T
        pos = torch.arange(tokens.shape[1])[None]
        out = layer(x, position_embeddings=rope(x, pos), position_ids=pos, attention_mask=None)
        out = out[0] if isinstance(out, tuple) else out
        theirs = out @ target.lm_head.weight.T  # no final norm, the target's head
    torch.testing.assert_close(ours_hidden, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_logits, theirs, atol=1e-5, rtol=1e-5)
    reloaded = hf_export.load_eagle(tmp_path / "e", target)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded.forward_dense(tokens, features)[0], ours_logits, atol=0, rtol=0
        )


def test_vllm_eagle_lm_refuses_a_feature_size_other_than_hidden():
    with pytest.raises(ValueError, match="feature_size"):
        hf_export.vllm_eagle_lm(CFG)
    with pytest.raises(ValueError, match="plain LM"):
        hf_export.llama_state_dict(
            hf_export.vllm_eagle_lm(LMConfig(**{**CFG.__dict__, "feature_size": CFG.hidden_size}))
        )


def _eagle3_pair(aux=(1,)):
    from dspark_research.speculative import eagle3

    target = _perturbed(TransformerLM(CFG, seed=0)).eval()
    cfg = LMConfig(**{**CFG.__dict__, "num_layers": 1})
    draft = _perturbed(eagle3.Eagle3Draft(cfg, aux, CFG.hidden_size, seed=2))
    eagle3.tie_eagle3_to_target(draft, target)
    with torch.no_grad():  # an lm_head of its own (the tie starts it from the target's)
        draft.lm_head.weight.add_(
            0.05
            * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(9))
        )
    return target, draft.eval()


def _vllm_eagle3_reference(state, config, embed, tokens, hidden, start=0):
    """vLLM's Eagle3 Llama written out from the checkpoint tensors (llama_eagle3.py):
    cat[input_layernorm(embed), hidden_norm(h)] -> attention -> + h -> MLP; lm_head(norm)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    heads, kv, d = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    m = "midlayer."
    s = tokens.shape[1]
    x = torch.cat(
        [
            rms(embed[tokens], state[m + "input_layernorm.weight"]),
            rms(hidden, state[m + "hidden_norm.weight"]),
        ],
        dim=-1,
    )
    q = (x @ state[m + "self_attn.q_proj.weight"].T).view(1, s, heads, d).transpose(1, 2)
    k = (x @ state[m + "self_attn.k_proj.weight"].T).view(1, s, kv, d).transpose(1, 2)
    v = (x @ state[m + "self_attn.v_proj.weight"].T).view(1, s, kv, d).transpose(1, 2)
    pos = torch.arange(start, start + s, dtype=torch.float32)
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.cat([pos[:, None] * inv, pos[:, None] * inv], dim=-1)[None]
    q, k = apply_rotary_pos_emb(q, k, ang.cos(), ang.sin())
    k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) * d**-0.5
    scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, s, heads * d)
    r = attn @ state[m + "self_attn.o_proj.weight"].T + hidden
    y = rms(r, state[m + "post_attention_layernorm.weight"])
    g, u = y @ state[m + "mlp.gate_proj.weight"].T, y @ state[m + "mlp.up_proj.weight"].T
    pre = r + (torch.nn.functional.silu(g) * u) @ state[m + "mlp.down_proj.weight"].T
    return rms(pre, state["norm.weight"]) @ state["lm_head.weight"].T, pre


@needs_transformers
@needs_safetensors
def test_eagle3_export_is_vllms_layout_and_round_trips(tmp_path):
    from safetensors.torch import load_file

    from dspark_research.speculative import eagle3

    target, draft = _eagle3_pair(aux=(1,))
    eagle3.export_eagle3(draft, tmp_path / "e3", max_position_embeddings=512, training_context=64)
    config = json.loads((tmp_path / "e3" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == config["vocab_size"] == 256
    assert config["target_hidden_size"] == CFG.hidden_size
    assert config["eagle_aux_hidden_state_layer_ids"] == [1]
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1]}
    assert config[hf_export.TRAINING_CONTEXT_KEY] == 64
    assert config["max_position_embeddings"] == 512
    state = load_file(str(tmp_path / "e3" / "model.safetensors"))
    assert sorted(state) == sorted(
        ["fc.weight", "norm.weight", "lm_head.weight"]
        + [
            "midlayer." + n + ".weight"
            for n in (
                "hidden_norm",
                "input_layernorm",
                "post_attention_layernorm",
                *(f"self_attn.{p}_proj" for p in "qkvo"),
                *(f"mlp.{p}_proj" for p in ("gate", "up", "down")),
            )
        ]
    )
    assert state["fc.weight"].shape == (CFG.hidden_size, CFG.hidden_size)
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * CFG.hidden_size
    tokens = torch.randint(0, 256, (1, 90), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        aux = eagle3.target_aux(target, tokens, (1,))
        # aux id 1: the input of target layer 1 = the output of layer 0
        expected_aux = target.layers[0].forward_dense(target.embed(tokens))
        torch.testing.assert_close(aux, expected_aux, atol=0, rtol=0)
        hidden = draft.combine(aux)
        ours, pre = draft.forward_dense(tokens, hidden)
        theirs, their_pre = _vllm_eagle3_reference(
            state, config, target.embed.weight, tokens, hidden
        )
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pre, their_pre, atol=1e-5, rtol=1e-5)
        reloaded = eagle3.load_eagle3(tmp_path / "e3", target)
        torch.testing.assert_close(
            reloaded.forward_dense(tokens, reloaded.combine(aux))[0], ours, atol=0, rtol=0
        )


def test_eagle3_unrolled_step_is_vllms_second_draft_step():
    """Step 2 at slot j (position j + 1) = one more causal position after step 1's slots
    0..j, fed the draft's own pre-norm hidden: what vLLM's second draft step computes."""
    from dspark_research.speculative import eagle3

    target, draft = _eagle3_pair(aux=(1,))
    gen = torch.Generator().manual_seed(7)
    seq = 20
    tokens = torch.randint(0, 256, (2, seq), generator=gen)
    nxt = torch.randint(0, 256, (2, seq), generator=gen)
    with torch.no_grad():
        aux = eagle3.target_aux(target, tokens, (1,))
        logits1, logits2 = draft.forward_unrolled(tokens, aux, nxt)
        hidden = draft.combine(aux)
        ref1, pre1 = draft.forward_dense(tokens, hidden)
        torch.testing.assert_close(logits1, ref1, atol=1e-5, rtol=1e-5)
        for j in (0, 5, seq - 1):
            toks = torch.cat([tokens[:, : j + 1], nxt[:, j : j + 1]], dim=1)
            hid = torch.cat([hidden[:, : j + 1], pre1[:, j : j + 1]], dim=1)
            last = draft.forward_dense(toks, hid)[0][:, -1]
            torch.testing.assert_close(logits2[:, j], last, atol=1e-5, rtol=1e-5)


def test_eagle3_training_lowers_both_steps_losses():
    from dspark_research.speculative import eagle3
    from dspark_research.speculative.training import TrainSpec

    target, draft = _eagle3_pair(aux=(1,))
    target.requires_grad_(False)
    data = torch.tensor(list(b"abcabcabd" * 400), dtype=torch.uint8)
    before = eagle3.eval_eagle3(draft, target, data, 32, batches=1, batch=4)
    embed = draft.embed.weight.clone()
    record = eagle3.train_eagle3(
        draft, target, data, TrainSpec(steps=30, batch=8, context=32, lr=3e-3, warmup=3)
    )
    after = eagle3.eval_eagle3(draft, target, data, 32, batches=1, batch=4)
    assert record["steps_done"] == 30 and record["unroll"] == 2
    assert after["step1"] < before["step1"] - 1 and after["step2"] < before["step2"] - 1
    assert torch.equal(draft.embed.weight, embed)  # the target's, frozen


def test_soft_cross_entropy_is_cross_entropy_against_the_teachers_distribution():
    import torch.nn.functional as F

    from dspark_research.speculative.training import soft_cross_entropy

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 11, generator=gen) * 3
    teacher = torch.randn(2, 5, 11, generator=gen) * 3
    p = F.softmax(teacher, -1)
    manual = -(p * F.log_softmax(logits, -1)).sum(-1).mean()
    torch.testing.assert_close(soft_cross_entropy(logits, teacher), manual)
    entropy = -(p * p.log()).sum(-1).mean()
    torch.testing.assert_close(soft_cross_entropy(teacher, teacher), entropy)
    assert soft_cross_entropy(logits, teacher) > entropy + 0.1  # Gibbs: only equal at p = q
    labels = torch.randint(0, 11, (2, 5), generator=gen)
    one_hot = F.one_hot(labels, 11).float() * 1e4  # a teacher sure of the labels
    hard = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1))
    torch.testing.assert_close(soft_cross_entropy(logits, one_hot), hard)


def test_distillation_reads_the_teachers_distribution_at_the_predicted_position():
    """train_lm's teacher loss: the teacher's logits on the same inputs; EAGLE3's step s at
    slot p (reads x[p + s], predicts x[p + s + 1]): the target's logits at position p + s."""
    from dspark_research.speculative import eagle3, training
    from dspark_research.speculative.training import soft_cross_entropy

    target, draft = _eagle3_pair(aux=(1,))
    gen = torch.Generator().manual_seed(11)
    windows = torch.randint(0, 256, (2, 25), generator=gen)
    context, seq = 24, 22
    with torch.no_grad():
        teacher_logits, _ = target.forward_dense(windows[:, :context])
        student = _perturbed(TransformerLM(CFG, seed=3)).eval()
        ce, _ = training._losses(student, windows, None, teacher=target)
        s_logits, _ = student.forward_dense(windows[:, :-1])
        t_logits, _ = target.forward_dense(windows[:, :-1])
        torch.testing.assert_close(ce, soft_cross_entropy(s_logits, t_logits))

        _, ce1, ce2 = eagle3._losses(draft, target, windows, 2, distill=True)
        aux = eagle3.target_aux(target, windows[:, :context], (1,))[:, :seq]
        logits1, logits2 = draft.forward_unrolled(
            windows[:, 1 : seq + 1], aux, windows[:, 2 : seq + 2]
        )
        want = {
            s: soft_cross_entropy(lg, teacher_logits[:, s : seq + s])
            for s, lg in ((1, logits1), (2, logits2))
        }
        torch.testing.assert_close(ce1, want[1])
        torch.testing.assert_close(ce2, want[2])
        # negative control: one position off is a different loss
        off = soft_cross_entropy(logits1, teacher_logits[:, 0:seq])
        assert abs(float(off) - float(ce1)) > 1e-3


def test_eagle3_bad_input_names_the_argument():
    from dspark_research.speculative import eagle3

    cfg = LMConfig(**{**CFG.__dict__, "num_layers": 1})
    with pytest.raises(ValueError, match=r"aux_layer_ids=\[0, 1\] is invalid: expected"):
        eagle3.Eagle3Draft(cfg, [0, 1], 64)
    with pytest.raises(ValueError, match=r"aux_layer_ids=\[2, 1\]"):
        eagle3.Eagle3Draft(cfg, [2, 1], 64)
    with pytest.raises(ValueError, match="num_layers=2 is invalid"):
        eagle3.Eagle3Draft(CFG, [1], 64)
    with pytest.raises(ValueError, match="target_hidden_size=0 is invalid"):
        eagle3.Eagle3Draft(cfg, [1], 0)
    with pytest.raises(ValueError, match=r"for a 2-layer target: expected ids < 2"):
        eagle3.tie_eagle3_to_target(eagle3.Eagle3Draft(cfg, [1, 2], 64), TransformerLM(CFG))
    with pytest.raises(ValueError, match="target_hidden_size=32 are invalid"):
        eagle3.tie_eagle3_to_target(eagle3.Eagle3Draft(cfg, [1], 32), TransformerLM(CFG))
    with pytest.raises(ValueError, match="unroll=3 is invalid: expected 1 or 2"):
        eagle3.train_eagle3(
            eagle3.Eagle3Draft(cfg, [1], 64),
            TransformerLM(CFG),
            torch.zeros(100, dtype=torch.uint8),
            eagle3.TrainSpec(steps=1, batch=1, context=8),
            unroll=3,
        )
    with pytest.raises(ValueError, match="expected an Eagle3Draft"):
        eagle3.eagle3_state_dict(TransformerLM(CFG))
    assert eagle3.default_aux_layer_ids(8) == (2, 4, 5)
    assert eagle3.default_aux_layer_ids(3) == (1, 2)


# ------------------------------ bench_engine: its report (bench_engine_report.py), engine config
class _Counter:
    def __init__(self, name, value):
        self.name, self.value = name, value


class _Vector:
    def __init__(self, name, values):
        self.name, self.values = name, values


class _Hist:
    def __init__(self, name, count, total):
        self.name, self.count, self.sum, self.buckets = name, count, total, {"+Inf": count}


def _metrics(drafts, accepted, per_pos, ttft=(0, 0.0), itl=(0, 0.0)):
    p = "vllm:spec_decode"
    return [
        _Counter(f"{p}_num_drafts", drafts),
        _Counter(f"{p}_num_accepted_tokens", accepted),
        _Counter(f"{p}_num_draft_tokens", drafts * len(per_pos)),
        _Vector(f"{p}_num_accepted_tokens_per_pos", per_pos),
        _Hist("vllm:time_to_first_token_seconds", *ttft),
        _Hist("vllm:inter_token_latency_seconds", *itl),
    ]


def test_the_report_half_needs_no_engine():
    """bench_engine_report.py imports neither vLLM nor torch (its tables are made from the
    cells alone, e.g. by ``--plot-only`` on a machine without an engine); bench_engine.py
    uses its functions, not copies."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import bench_engine_report; "
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "benchmarks")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    import bench_engine
    import bench_engine_report

    for name in ("snapshot", "delta", "cell_stats", "check_lossless", "summarize", "markdown"):
        assert getattr(bench_engine, name) is getattr(bench_engine_report, name)


def test_metric_differencing_gives_the_cells_own_counts():
    import bench_engine_report as be

    before = be.snapshot(_metrics(10, 20, [8, 7, 5], ttft=(2, 1.0), itl=(50, 0.5)))
    after = be.snapshot(_metrics(30, 50, [26, 19, 5], ttft=(4, 1.6), itl=(150, 1.5)))
    d = be.delta(before, after)
    s = be.cell_stats(d, 3)
    assert s["drafts"] == 20 and s["accepted"] == 30
    assert s["accepted_per_pos"] == [18, 12, 0]
    assert s["acceptance_length"] == pytest.approx(2.5)
    assert s["acceptance_per_pos"] == pytest.approx([0.9, 0.6, 0.0])
    assert s["ttft_s"] == pytest.approx(0.3)
    assert s["itl_s"] == pytest.approx(0.01)
    # a counter that is new after the cell counts from zero; labels sets add up
    assert be.delta({}, {"x": 3})["x"] == 3
    assert be.snapshot([_Counter("y", 2), _Counter("y", 5)])["y"] == 7


def test_no_speculation_cells_have_no_acceptance():
    import bench_engine_report as be

    s = be.cell_stats(
        be.delta({}, be.snapshot([_Hist("vllm:time_to_first_token_seconds", 1, 0.2)])), 5
    )
    assert s["acceptance_length"] is None and s["drafts"] == 0 and s["ttft_s"] == 0.2


def _cell(
    setting, context, repeat, tps, drafts, accepted, per_pos, tokens=None, temp=0.0, window=None
):
    return {
        "family": "draft_model" if setting != "nospec" else "-",
        "setting": setting,
        "window": window,
        "context": context,
        "batch": 1,
        "temperature": temp,
        "repeat": repeat,
        "tokens_per_s": tps,
        "decode_tokens_per_s": tps,
        "ttft_s": 0.1,
        "itl_s": 0.01,
        "drafts": drafts,
        "accepted": accepted,
        "accepted_per_pos": per_pos,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "tokens": tokens,
    }


def test_summary_pools_acceptance_and_spreads_tokens_per_s_and_checks_losslessness():
    import bench_engine_report as be

    cells = [
        _cell("nospec", 64, 0, 100.0, 0, 0, [], tokens=[[1, 2, 3]]),
        _cell("off", 64, 0, 150.0, 10, 20, [9, 7, 4], tokens=[[1, 2, 3]]),
        _cell("off", 64, 1, 170.0, 30, 30, [20, 8, 2], tokens=[[7, 8, 9]]),
        _cell("w1x", 64, 0, 160.0, 10, 25, [10, 9, 6], tokens=[[1, 2, 4]], window=64),
        # batch 1, repeat 1 runs prompt 1: its reference is nospec's repeat 1
        _cell("nospec", 64, 1, 100.0, 0, 0, [], tokens=[[7, 8, 9]]),
    ]
    be.check_lossless(cells)
    assert cells[1]["lossless"] is True and cells[2]["lossless"] is True
    assert cells[3]["lossless"] is False
    rows = {r["setting"]: r for r in be.summarize(cells)}
    off = rows["off"]
    assert off["repeats"] == 2
    assert off["tokens_per_s"] == pytest.approx(160.0)
    assert off["tokens_per_s_std"] == pytest.approx(14.142, rel=1e-3)
    assert off["acceptance_length"] == pytest.approx(1 + 50 / 40)
    assert off["acceptance_per_pos"] == pytest.approx([29 / 40, 15 / 40, 6 / 40])
    assert rows["nospec"]["acceptance_length"] is None
    result = {
        "meta": {"device": "cpu", "versions": {"vllm": "x"}},
        "summary": be.summarize(cells),
        "engines": [
            {
                "family": "draft_model",
                "setting": "off",
                "window": None,
                "init_s": 40.0,
                "kv_cache_tokens": 1000,
                "peak_memory_bytes": None,
                "cells": 2,
            }
        ],
        "our_loop": [{"family": "draft_model", "setting": "off", "context": 64, "tau": 2.2}],
    }
    md = be.markdown(result)
    assert "| draft_model | 1 | 0.0 | off | 160 +- 14 |" in md
    assert "2.25" in md and "(not lossless)" in md and "Our loop vs vLLM" in md


def test_engine_kwargs_are_the_readme_configuration():
    import bench_engine as be

    spec = {
        "target": "T",
        "draft": "D",
        "method": "draft_model",
        "setting": "w1x",
        "window": 64,
        "num_speculative_tokens": 5,
        "dtype": "float32",
        "max_model_len": 1120,
        "max_num_seqs": 4,
        "block_size": 32,
    }
    kw = be.engine_kwargs(spec)
    assert kw["compilation_config"] == {
        "inductor_passes": {"post_grad_custom_post_pass": "dspark_compile_vllm.draft_window_pass"},
        "splitting_ops": [],
    }
    assert kw["additional_config"] == {"draft_window_size": 64}
    assert kw["speculative_config"] == {
        "method": "draft_model",
        "model": "D",
        "num_speculative_tokens": 5,
    }
    assert kw["skip_tokenizer_init"] is True
    off = be.engine_kwargs({**spec, "setting": "off", "window": None})
    assert "additional_config" not in off and "speculative_config" in off
    nospec = be.engine_kwargs({**spec, "setting": "nospec", "window": None})
    assert "speculative_config" not in nospec
    full_kv = be.engine_kwargs({**spec, "setting": "w1x-fullkv", "kv_memory": False})
    assert full_kv["additional_config"] == {
        "draft_window_size": 64,
        "draft_window_kv_memory": False,
    }


def test_settings_name_their_window_and_kv_memory():
    import bench_engine_report as ber

    windows = {s: ber.setting_window(s, 512) for s in ber.SETTINGS}
    assert windows == {
        "nospec": None,
        "off": None,
        "w1x": 512,
        "w2x": 1024,
        "w1x-fullkv": 512,
        "w2x-fullkv": 1024,
        "native": None,
    }
    assert [s for s in ber.SETTINGS if not ber.setting_kv_memory(s)] == ["w1x-fullkv", "w2x-fullkv"]
    assert set(ber.DEFAULT_SETTINGS) == set(ber.SETTINGS) - {"w1x-fullkv", "w2x-fullkv"}
    with pytest.raises(ValueError, match=r"setting='w3x' is not one of"):
        ber.setting_window("w3x", 512)


def test_an_engine_that_started_late_still_times_its_first_cell():
    """The engine's cell time counts from the engine being up: an engine whose start took
    its whole share (as on the H200, 47-54 s of a 68 s share) still runs its first cell,
    and stops after it once its share is used."""
    import bench_engine as be

    up, hard = 100.0, 200.0
    cells_until = up + 0.0  # share entirely taken by the start
    assert not be.stop_cells(up + 1, cells_until, hard, cells_done=0)
    assert be.stop_cells(up + 1, cells_until, hard, cells_done=1)
    # within its share it keeps going; past the hard limit it stops even before a cell
    assert not be.stop_cells(up + 5, up + 30, hard, cells_done=3)
    assert be.stop_cells(hard + 1, up + 500, hard, cells_done=0)


def test_batched_contexts_limit_only_the_batched_cells():
    """``--batched-contexts`` narrows the batch > 1 cells to its contexts, in the sweep's
    order; batch 1 keeps every context; unset, every batch runs every context."""
    import bench_engine as be

    spec = {"contexts": [512, 1024, 2048, 4096, 8192], "batched_contexts": [8192, 512]}
    assert be.batch_contexts(spec, 1) == [512, 1024, 2048, 4096, 8192]
    assert be.batch_contexts(spec, 32) == [512, 8192]
    assert be.batch_contexts({"contexts": [512, 2048]}, 32) == [512, 2048]
    assert be.batch_contexts({"contexts": [512], "batched_contexts": None}, 8) == [512]


def test_batched_contexts_outside_the_contexts_are_refused(tmp_path, capsys):
    import bench_engine as be

    (tmp_path / "train_report.json").write_text(json.dumps({"draft_context": 64}))
    (tmp_path / "prompts.json").write_text(json.dumps({"prompts": {"64": [[1, 2]]}}))
    with pytest.raises(SystemExit):
        be.main(
            [
                "--pair",
                str(tmp_path),
                "--out",
                str(tmp_path / "r.json"),
                "--batched-contexts",
                "128",
            ]
        )
    err = capsys.readouterr().err
    assert "--batched-contexts" in err and "128" in err and "[64]" in err


def test_ratio_table_is_tokens_per_s_over_the_same_draft_without_the_window():
    import bench_engine_report as be

    cells = [
        _cell("nospec", 64, 0, 100.0, 0, 0, []),
        _cell("off", 64, 0, 50.0, 10, 5, [5, 0, 0]),
        _cell("w1x", 64, 0, 120.0, 10, 25, [10, 9, 6], window=64),
    ]
    lines = be.ratio_lines(be.summarize(cells), [64])
    assert "| draft_model | 1 | 0.0 | w1x | 2.40x, vs nospec 1.20 |" in lines


def test_native_draft_declares_every_layer_sliding_and_links_the_weights(tmp_path):
    import json

    import bench_engine as be

    src = tmp_path / "draft"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    (src / "model.safetensors").write_bytes(b"weights")
    got = be.native_draft(src, tmp_path / "native", 59)
    config = json.loads((got / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] * 2
    assert config["sliding_window"] == 59
    assert (got / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((src / "config.json").read_text()) == {"num_hidden_layers": 2}


def test_native_sliding_window_is_the_kv_spec_window():
    import bench_engine as be

    from dspark_compile.integrations.vllm import kv_spec

    for window, k in ((512, 5), (64, 3), (2048, 3), (7, 6)):
        assert be.native_sliding_window(window, k) == kv_spec.draft_sliding_window(window, k)


def test_eagle3_family_runs_the_v1_runner_and_the_pairs_eagle3_checkpoint(tmp_path):
    import bench_engine as be

    assert "eagle3" in be.FAMILIES and be.FAMILY_DRAFTS["eagle3"] == ("eagle3", "eagle3")
    assert be.worker_env({"model_runner": "v1"}) == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert be.worker_env({"model_runner": None}) == {}
    spec = {
        "target": "T",
        "draft": "E3",
        "method": "eagle3",
        "setting": "w1x",
        "window": 64,
        "num_speculative_tokens": 5,
        "dtype": "float32",
        "max_model_len": 1120,
        "max_num_seqs": 4,
    }
    assert be.engine_kwargs(spec)["speculative_config"]["method"] == "eagle3"
    # native: the draft's one layer declared sliding-window (vLLM indexes EAGLE3
    # layer_types draft-relative), aux ids untouched
    src = tmp_path / "eagle3"
    src.mkdir()
    (src / "config.json").write_text(
        json.dumps({"num_hidden_layers": 1, "eagle_aux_hidden_state_layer_ids": [1, 2]})
    )
    config = json.loads((be.native_draft(src, tmp_path / "n", 59) / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] and config["sliding_window"] == 59
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2]


def test_a_draft_model_path_vllm_would_read_as_eagle3_is_linked_neutrally(tmp_path):
    import bench_engine as be

    src = tmp_path / "wt-eagle3" / "draft"
    src.mkdir(parents=True)
    assert be.method_from_path(str(src)) == "eagle3"
    assert be.method_from_path("/pair/eagle") is None
    linked = be.neutral_draft_path({"method": "draft_model", "draft": str(src)})
    assert linked and be.method_from_path(linked) is None
    assert Path(linked).resolve() == src.resolve()
    # other methods name their draft themselves; neutral paths stay
    assert be.neutral_draft_path({"method": "eagle3", "draft": str(src)}) is None
    assert be.neutral_draft_path({"method": "draft_model", "draft": "/pair/draft"}) is None


def test_twin_engines_are_reported_apart_and_round_time_is_per_prompt(tmp_path):
    """``--replicas``: a setting's second engine is recorded as ``SETTING#2``; every table
    keeps it apart, and the round-time table divides each cell's ITL by ``off``'s on the
    same prompt (repeat), geometric mean over repeats."""
    import bench_engine_report as be

    def cell(setting, repeat, itl, family="draft_model"):
        c = _cell(setting, 512, repeat, 100.0, 10, 10, [6, 4], window=None)
        c.update(family=family if setting.split("#")[0] != "nospec" else "-", itl_s=itl)
        return c

    cells = [
        cell("nospec", 0, 0.002),
        cell("nospec#2", 0, 0.002),
        cell("off", 0, 0.010),
        cell("off", 1, 0.020),
        cell("off#2", 0, 0.011),
        cell("off#2", 1, 0.022),
        cell("w2x", 0, 0.012),
        cell("w2x", 1, 0.030),
        cell("w2x#2", 0, 0.010),
    ]
    ratios = be.round_time_ratios(cells)
    assert ratios[("draft_model", 1, 0.0, "w2x", 512)] == pytest.approx([1.2, 1.5])
    assert ratios[("draft_model", 1, 0.0, "off#2", 512)] == pytest.approx([1.1, 1.1])
    assert ratios[("draft_model", 1, 0.0, "w2x#2", 512)] == pytest.approx([1.0])
    assert not any(k[3].startswith("nospec") or k[3] == "off" for k in ratios)
    rows = be.summarize(cells)
    assert [r["setting"] for r in rows if r["family"] == "draft_model"] == [
        "off",
        "off#2",
        "w2x",
        "w2x#2",
    ]
    result = {"meta": {}, "summary": rows, "cells": cells, "engines": []}
    md = be.markdown(result)
    table = md.split("## Round time over `off`")[1].split("\n## ")[0]
    assert "| draft_model | 1 | 0.0 | w2x | 1.34 (2) |" in table  # sqrt(1.2 * 1.5)
    assert "| draft_model | 1 | 0.0 | off#2 | 1.10 (2) |" in table
    assert "| draft_model | 1 | 0.0 | w2x#2 | 1.00 (1) |" in table
    be.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_sort_order_of_settings_and_their_twins():
    import bench_engine_report as be

    labels = ["w2x#2", "off", "nospec#2", "w1x", "off#3", "nospec", "off#2"]
    assert sorted(labels, key=be.setting_order) == [
        "nospec",
        "nospec#2",
        "off",
        "off#2",
        "off#3",
        "w1x",
        "w2x#2",
    ]
    assert be.base_setting("off#2") == "off" and be.base_setting("w1x") == "w1x"
