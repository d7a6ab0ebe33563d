"""``benchmarks/twin_round_cost.py``: the pooled per-round cost of a setting over its base
from a ``bench_engine.py --replicas 2`` run, on a run whose round times are known."""

from __future__ import annotations

import json
import lzma
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import twin_round_cost as trc  # noqa: E402

# ms per round of each engine in repeats 0, 1, 2 (drafts = 10 rounds per cell)
ROUND_MS = {
    "off": [10.0, 12.0, 11.0],
    "off#2": [10.0 * 1.21, 12.0 * 1.21, 11.0 * 1.21],
    "w2x": [11.0, 13.2, 12.1],
    "w2x#2": [11.0, 13.2, 12.1],
}


def _run(path: Path, drop: tuple[str, int] | None = None) -> Path:
    cells = []
    for setting, times in ROUND_MS.items():
        for repeat, ms in enumerate(times):
            if (setting, repeat) == drop:
                continue
            cells.append(
                {
                    "family": "draft_model",
                    "context": 512,
                    "batch": 1,
                    "temperature": 0.0,
                    "setting": setting,
                    "repeat": repeat,
                    "drafts": 10,
                    "decode_s": ms * 10 / 1e3,
                    "output_tokens": 35,
                }
            )
    # a cell that never drafted (e.g. nospec) is ignored
    cells.append({**cells[0], "setting": "nospec", "drafts": 0})
    with lzma.open(path, "wt") as f:
        json.dump({"cells": cells}, f)
    return path


def test_pooled_ratio_and_twin_spread(tmp_path):
    lines = trc.report(_run(tmp_path / "run.json.xz"), "w2x", "off", 200)
    text = "\n".join(lines)
    assert "draft_model, context 512, batch 1, T=0.0: 3 repeats" in text
    # pooled: sqrt(w2x * w2x#2) / sqrt(off * off#2) = 1.1 / sqrt(1.21) = 1.0 in every repeat
    assert "w2x over off, twins pooled: 1.000 (95% bootstrap over repeats [1.000, 1.000])" in text
    assert "twins: off#2/off 1.210, w2x#2/w2x 1.000" in text
    assert "off        round  11.00 ms (median), 3.50 tokens/round" in text
    assert math.isclose(trc.geomean([2.0, 8.0]), 4.0)


def test_a_repeat_missing_on_one_engine_is_left_out(tmp_path):
    lines = trc.report(_run(tmp_path / "run.json.xz", drop=("w2x#2", 1)), "w2x", "off", 200)
    assert any("2 repeats" in line for line in lines)
    assert any("round  10.50 ms (median)" in line for line in lines)  # off: 10 and 11


def test_command_line_errors_name_the_argument(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["twin_round_cost.py", str(tmp_path / "none.json")])
    with pytest.raises(SystemExit):
        trc.main()
    assert "does not exist" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["twin_round_cost.py", "x.json", "--resamples", "5"])
    with pytest.raises(SystemExit):
        trc.main()
    assert "--resamples: 5: expected an int >= 100" in capsys.readouterr().err
