"""``benchmarks/bench_engine.py``'s command line: every numeric option rejects what no
engine could run, before a pair is read or an engine starts, with an error that names the
option, the value and what is allowed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_engine  # noqa: E402

BAD = [
    ("--repeats", "0", "expected an int > 0"),
    ("--new-tokens", "-3", "expected an int > 0"),
    ("--num-speculative-tokens", "two", "'two' is not an int"),
    ("--block-size", "0", "expected an int > 0"),
    ("--max-model-len", "1.5", "'1.5' is not an int"),
    ("--gpu-memory-utilization", "1.2", "expected a float > 0 and <= 1"),
    ("--gpu-memory-utilization", "0", "expected a float > 0 and <= 1"),
    ("--kv-cache-gib", "0", "expected a float > 0"),
    ("--kv-cache-gib", "nan-ish", "'nan-ish' is not a float"),
    ("--kv-cache-gib", "nan", "expected a float > 0"),
    ("--max-seconds", "inf", "expected a float > 0"),
    ("--max-start-seconds", "-1", "expected a float > 0"),
    ("--max-seconds", "0", "expected a float > 0"),
    ("--our-loop-block-size", "0", "expected an int > 0"),
    ("--batches", "1,0", "expected an int > 0"),
    ("--batches", ",", "expected a comma-separated list"),
    ("--contexts", "512,x", "'x' is not an int"),
    ("--batched-contexts", "-512", "expected an int > 0"),
    ("--temperatures", "0,-1", "expected a float >= 0"),
]


@pytest.mark.parametrize(("option", "value", "allowed"), BAD)
def test_a_bad_value_names_the_option_the_value_and_what_is_allowed(
    option, value, allowed, tmp_path, capsys
):
    with pytest.raises(SystemExit) as stop:
        bench_engine.main(
            ["--pair", str(tmp_path), "--out", str(tmp_path / "r.json"), f"{option}={value}"]
        )
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and allowed in err, err


def test_good_values_parse_to_numbers():
    parse = bench_engine.POSITIVE_INTS
    assert parse("512, 8192") == [512, 8192]
    assert bench_engine.TEMPERATURES("0,1") == [0.0, 1.0]
    assert bench_engine.MEMORY_FRACTION("1") == 1.0
    assert bench_engine.POSITIVE_FLOAT("6.5") == 6.5


def test_a_context_without_prompts_is_named(tmp_path, capsys):
    (tmp_path / "train_report.json").write_text(json.dumps({"draft_context": 64}))
    (tmp_path / "prompts.json").write_text(json.dumps({"prompts": {"64": [[1, 2]], "1024": [[3]]}}))
    with pytest.raises(SystemExit):
        bench_engine.main(
            ["--pair", str(tmp_path), "--out", str(tmp_path / "r.json"), "--contexts", "64,512"]
        )
    err = capsys.readouterr().err
    assert "--contexts: [512] not in the pair's prompts.json (it has ['64', '1024'])" in err
    assert not (tmp_path / "r.json").exists()


def test_side_by_side_can_be_turned_off_after_a_script_turned_it_on(tmp_path):
    common = ["--pair", str(tmp_path), "--out", str(tmp_path / "r.json")]
    for flags, expected in (
        (["--side-by-side"], True),
        (["--side-by-side", "--no-side-by-side"], False),
        ([], False),
    ):
        assert bench_engine.build_parser().parse_args(common + flags).side_by_side is expected


def test_the_engine_plan_starts_twins_of_every_setting():
    plan = bench_engine.engine_plan(["draft_model", "eagle3"], ["nospec", "off", "w1x"], 2)
    assert plan == [
        ("-", "nospec", "nospec"),
        ("-", "nospec", "nospec#2"),
        ("draft_model", "off", "off"),
        ("draft_model", "off", "off#2"),
        ("draft_model", "w1x", "w1x"),
        ("draft_model", "w1x", "w1x#2"),
        ("eagle3", "off", "off"),
        ("eagle3", "off", "off#2"),
        ("eagle3", "w1x", "w1x"),
        ("eagle3", "w1x", "w1x#2"),
    ]
    assert bench_engine.engine_plan(["draft_model"], ["off", "w2x"]) == [
        ("draft_model", "off", "off"),
        ("draft_model", "w2x", "w2x"),
    ]
    names = {bench_engine.engine_name(f, label) for f, _, label in plan}
    assert len(names) == len(plan)  # one log / spec file per engine
    assert bench_engine.engine_name("-", "nospec#2") == "nospec-r2"
    assert bench_engine.engine_name("eagle3", "w1x#2") == "eagle3-w1x-r2"


def test_replicas_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_engine.main(
            ["--pair", str(tmp_path), "--out", str(tmp_path / "r.json"), "--replicas", "0"]
        )
    assert "argument --replicas: '0': expected an int > 0" in capsys.readouterr().err
