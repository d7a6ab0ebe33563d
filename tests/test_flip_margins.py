"""``benchmarks/flip_margins.py``: which speculative requests left no-speculation's greedy
output, and the target's log-probability margin there (on a tiny random Llama)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import flip_margins as fm  # noqa: E402

transformers = pytest.importorskip("transformers")


def _cell(setting, tokens, context=16, repeat=0, batch=1, temperature=0.0):
    return {
        "family": "-" if setting == "nospec" else "draft_model",
        "setting": setting,
        "context": context,
        "repeat": repeat,
        "batch": batch,
        "temperature": temperature,
        "tokens": [tokens],
    }


def _target(path: Path):
    cfg = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path / "target")
    return model


def _greedy(model, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_differences_keeps_batch1_greedy_requests_that_left_nospec():
    base = {"cells": [_cell("nospec", [1, 2, 3]), _cell("nospec", [4, 5, 6], repeat=1)]}
    result = {
        "cells": [
            _cell("off", [1, 2, 3]),
            _cell("w1x", [1, 9, 3]),
            _cell("w1x", [4, 5, 6], repeat=1),
            _cell("w1x", [7, 7, 7], batch=32),  # batch > 1: not compared
            _cell("w1x", [7, 7, 7], temperature=1.0),  # sampled: not compared
            _cell("w1x", [7, 7, 7], repeat=5),  # no nospec request to compare with
        ]
    }
    rows, compared = fm.differences(result, base)
    assert compared == 3
    assert [(r["setting"], r["position"], r["nospec_token"], r["token"]) for r in rows] == [
        ("w1x", 1, 2, 9)
    ]


def test_margin_is_the_targets_logprob_gap_on_the_shared_prefix(tmp_path):
    model = _target(tmp_path)
    prompt = [
        int(x) for x in torch.randint(0, 50, (16,), generator=torch.Generator().manual_seed(2))
    ]
    ref = _greedy(model, prompt, 8)
    # a request that takes the target's second choice at position 3, then the target's greedy path
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ref[:3]])).logits[0, -1]
    second = int(logits.topk(2).indices[1])
    other = ref[:3] + [second] + _greedy(model, prompt + ref[:3] + [second], 4)
    lp = torch.log_softmax(logits.float(), -1)
    (tmp_path / "prompts.json").write_text(json.dumps({"prompts": {"16": [prompt]}}))
    base = {"cells": [_cell("nospec", ref)]}
    rows, compared = fm.differences({"cells": [_cell("w1x", other)]}, base)
    assert compared == 1 and rows[0]["position"] == 3
    scored = fm.margins(tmp_path, {"16": [prompt]}, rows)
    row = scored[0]
    assert row["margin_fp32"] == pytest.approx(float(lp[ref[3]] - lp[second]), abs=1e-5)
    assert row["margin_fp32"] > 0 and row["rank_fp32"] == 2
    assert row["nospec_off_argmax_fp32"] == []  # the target's own greedy output
    assert [p for p, _ in row["spec_off_argmax_fp32"]] == [3]
    assert row["spec_off_argmax_fp32"][0][1] == pytest.approx(row["margin_fp32"], abs=1e-4)
    assert "bf16" in fm.markdown(scored, compared, ["x.json"])


def test_cli_names_a_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fm.main(
            [
                "--pair",
                str(tmp_path),
                "--result",
                str(tmp_path / "nope.json"),
                "--out",
                str(tmp_path / "o.md"),
            ]
        )
    assert "nope.json: no such file" in capsys.readouterr().err
