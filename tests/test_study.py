"""The acceptance study end to end (smoke scale), its corpus, training and reports."""

import json

import pytest
import torch

from dspark_research import cli
from dspark_research.speculative.checks import goal_check
from dspark_research.speculative.corpus import is_held_out, load_corpus, random_windows
from dspark_research.speculative.lm import LMConfig, TransformerLM
from dspark_research.speculative.scales import SCALES
from dspark_research.speculative.study import run_study
from dspark_research.speculative.training import TrainSpec, eval_loss, train_lm


def test_corpus_split_is_deterministic_and_disjoint():
    a = load_corpus(eval_fraction=0.05, max_bytes=100_000)
    b = load_corpus(eval_fraction=0.05, max_bytes=100_000)
    assert a.train_files == b.train_files and a.eval_files == b.eval_files
    assert not set(a.train_files) & set(a.eval_files)
    assert all(is_held_out(f, 0.05) for f in a.eval_files)
    assert torch.equal(a.train, b.train) and a.train.dtype == torch.uint8
    assert int((a.train == 0).sum()) == len(a.train_files) - 1  # one separator between files
    windows = random_windows(a.eval, 3, 16, torch.Generator().manual_seed(0))
    assert windows.shape == (3, 17) and windows.dtype == torch.int64
    with pytest.raises(ValueError, match="eval_fraction=0 is invalid"):
        load_corpus(eval_fraction=0)


def test_training_lowers_heldout_loss():
    corpus = load_corpus(max_bytes=200_000)
    model = TransformerLM(
        LMConfig(
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
            intermediate_size=64,
        ),
        seed=0,
    )
    before = eval_loss(model, corpus.eval, context=32, batches=2)
    record = train_lm(
        model, corpus.train, TrainSpec(steps=60, batch=8, context=32, lr=3e-3, warmup=5)
    )
    after = eval_loss(model, corpus.eval, context=32, batches=2)
    assert record["steps_done"] == 60
    assert after < before - 1.0, (before, after)  # ~5.5 (uniform) -> well below


def test_goal_check_uses_the_in_distribution_short_context_tau():
    rows = [
        {"family": "draft_model", "window": w, "context": c, "tau": t}
        for w, c, t in [
            (None, 8, 2.0),
            (8, 8, 4.0),
            (16, 8, 3.0),
            (None, 128, 1.2),
            (8, 128, 3.9),
            (16, 128, 2.0),
        ]
    ]
    goal = goal_check(rows, (8, 128), draft_context=8)["draft_model"]
    assert goal["tau_short"] == 4.0 and goal["tau_short_no_window"] == 2.0
    assert goal["no_window_ratio"] == pytest.approx(0.3) and goal["collapse_goal_met"]
    assert goal["best_window"] == 8 and goal["best_window_ratio"] == pytest.approx(0.975)
    assert goal["recovery_goal_met"]


def test_study_smoke_writes_json_markdown_and_plot(tmp_path, capsys):
    scale = SCALES["smoke"]
    study = run_study(scale, tmp_path, device="cpu", checkpoint=tmp_path / "pair.pt")
    saved = json.loads((tmp_path / "study.json").read_text())
    settings = [s["name"] for s in saved["settings"]]
    assert settings == [
        "no window",
        "W=16 (1x)",
        "W=32 (2x)",
        "W=16 (1x) + S=16 (1 block)",
        "W=16 (1x) + S=64 (4 blocks)",
    ]
    assert [s["options"].get("draft_sink_size", 0) for s in saved["settings"]] == [0, 0, 0, 16, 64]
    cells = {(r["family"], r["setting"], r["context"]) for r in saved["results"]}
    assert cells == {
        (f, s, c) for f in ("draft_model", "eagle") for s in settings for c in scale.contexts
    }
    for row in saved["results"]:
        assert 1.0 <= row["tau"] <= scale.num_speculative_tokens + 1
        assert row["matches_target_greedy"] == 1.0  # exact on the CPU
        assert row["rounds"] > 0 and row["tokens_per_s"] > 0
    assert all(c["graphs"] <= 2 for c in saved["compile"])  # no recompiles per context
    assert saved["meta"]["corpus"]["eval_files"]
    # provenance: the commit of this checkout (a git work tree here)
    assert len(saved["meta"]["git"]["commit"]) == 40 and saved["meta"]["git"]["dirty"] in (
        True,
        False,
    )
    assert "## tau" in (tmp_path / "study.md").read_text()
    report = (tmp_path / "study.md").read_text()
    assert "| eagle | W=16 (1x) + S=64 (4 blocks) |" in report
    assert "## Attention sinks: tau with sinks - tau with the same window alone" in report
    assert {r["sink_size"] for r in saved["results"]} == {0, 16, 64}
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"
    assert study["results"] == saved["results"]
    # the report command rebuilds both from the JSON alone
    out = tmp_path / "again"
    assert cli.main(["study-report", str(tmp_path / "study.json"), "--out-dir", str(out)]) == 0
    assert (out / "study.md").read_text() == (tmp_path / "study.md").read_text()
    assert (out / "study.png").is_file()


def test_study_report_missing_file_exits_2(tmp_path, capsys):
    assert cli.main(["study-report", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_study_settings_filter(capsys):
    scale = SCALES["h200"]
    assert [s.key for s in scale.settings()] == ["none", "w1x", "w2x", "w4x", "w1x+s1b", "w1x+s4b"]
    picked = scale.select_settings(("w1x+s4b", "w1x"))
    assert [s.name for s in picked] == ["W=256 (1x)", "W=256 (1x) + S=64 (4 blocks)"]
    assert picked[1].options == {"draft_window_size": 256, "draft_sink_size": 64}
    with pytest.raises(ValueError, match=r"settings=\['w8x'\] is invalid: expected one or more"):
        scale.select_settings(["w8x"])
    assert cli.main(["study", "--scale", "smoke", "--settings", "w8x"]) == 2
    assert "--settings: settings=['w8x'] is invalid" in capsys.readouterr().err


def test_goal_check_ignores_sink_rows_and_sink_check_compares_them():
    from dspark_research.speculative.checks import sink_check

    rows = [
        {
            "family": "eagle",
            "window": w,
            "sink_size": s,
            "context": c,
            "tau": t,
            "setting": f"{w}/{s}",
        }
        for w, s, c, t in [
            (None, 0, 8, 2.0),
            (8, 0, 8, 4.0),
            (None, 0, 128, 1.2),
            (8, 0, 128, 3.0),
            (8, 16, 128, 3.5),
            (8, 16, 8, 4.0),
        ]
    ]
    goal = goal_check(rows, (8, 128), draft_context=8)["eagle"]
    assert goal["tau_long_best_window"] == 3.0  # not the sink row's 3.5
    assert sink_check(rows) == {"eagle": {"8/16": {128: (3.0, 3.5, 0.5), 8: (4.0, 4.0, 0.0)}}}
