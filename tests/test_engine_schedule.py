"""The side-by-side schedule (``benchmarks/engine_schedule.py``) with stand-in engine
processes that speak its JSON-line protocol: every cell on every engine, in rotated order;
an engine that fails to start, hangs or errs is noted and the rest go on; a round that
would end past the deadline is skipped and named. The real engine behind the protocol
(``bench_engine.py --serve``) runs in ``tests_engine/test_side_by_side.py``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import engine_schedule as es  # noqa: E402

STAND_IN = r"""
import json, sys, time
name, mode = sys.argv[1], sys.argv[2]
if mode == "crash":
    print("cannot start", file=sys.stderr)
    sys.exit(3)
if mode == "slow-start":
    time.sleep(30)
print(json.dumps({"ready": {"family": "f", "setting": name, "init_s": 0.5}}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if request.get("quit"):
        break
    t, b, c, r = request["cell"]
    if mode == "hang" and c == 2:
        time.sleep(60)
    if mode == "err" and c == 1:
        print(json.dumps({"error": f"T={t} B={b} ctx={c}: boom"}), flush=True)
        continue
    cell = {"setting": name, "temperature": t, "batch": b, "context": c, "repeat": r}
    print(json.dumps({"cell": cell}), flush=True)
print(json.dumps({"done": {"peak_memory_bytes": 7}}), flush=True)
"""


def _commands(tmp_path: Path, modes: dict[str, str]) -> dict:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    return {name: ([sys.executable, str(script), name, mode], {}) for name, mode in modes.items()}


def _run(tmp_path, modes, cells, deadline_s=60.0, reply_timeout=20.0, start_s=20.0):
    now = time.time()
    return es.run_side_by_side(
        _commands(tmp_path, modes),
        cells,
        tmp_path,
        start_deadline=now + start_s,
        deadline=now + deadline_s,
        reply_timeout=reply_timeout,
        log=lambda msg: None,
    )


CELLS = [(0.0, 1, c, r) for r in range(2) for c in (1, 2, 3)]


def test_every_cell_runs_on_every_engine_in_rotated_order(tmp_path):
    got = _run(tmp_path, {"a": "ok", "b": "ok", "c": "ok"}, CELLS)
    assert got.notes == []
    assert len(got.cells) == 3 * len(CELLS)
    for index, cell in enumerate(CELLS):
        round_ = got.cells[3 * index : 3 * index + 3]
        assert [c["setting"] for c in round_] == es.rotated(["a", "b", "c"], index)
        assert {(c["temperature"], c["batch"], c["context"], c["repeat"]) for c in round_} == {cell}
    # the start record merged with the one given at quit
    assert got.engines["b"] == {
        "family": "f",
        "setting": "b",
        "init_s": 0.5,
        "peak_memory_bytes": 7,
    }


def test_an_engine_that_cannot_start_is_noted_and_the_rest_run(tmp_path):
    got = _run(tmp_path, {"a": "ok", "bad": "crash"}, CELLS)
    assert set(got.engines) == {"a"}
    assert len(got.cells) == len(CELLS)
    assert any(n.startswith("bad: exited") for n in got.notes)


def test_an_engine_late_past_the_start_deadline_is_stopped(tmp_path):
    t0 = time.time()
    got = _run(tmp_path, {"a": "ok", "late": "slow-start"}, CELLS[:2], start_s=2.0)
    assert time.time() - t0 < 20
    assert set(got.engines) == {"a"} and len(got.cells) == 2
    assert any(n.startswith("late: did not start in time") for n in got.notes)


def test_a_hung_engine_is_stopped_and_the_others_finish(tmp_path):
    got = _run(tmp_path, {"a": "ok", "h": "hang"}, CELLS, reply_timeout=2.0)
    h_cells = [c for c in got.cells if c["setting"] == "h"]
    assert [c["context"] for c in h_cells] == [1]  # it answered context 1, then hung
    assert len([c for c in got.cells if c["setting"] == "a"]) == len(CELLS)
    assert any(n.startswith("h: no answer to cell [0.0, 1, 2, 0]") for n in got.notes)


def test_a_failed_cell_is_noted_and_the_engine_goes_on(tmp_path):
    got = _run(tmp_path, {"e": "err"}, CELLS)
    assert sorted({c["context"] for c in got.cells}) == [2, 3]
    assert sum("ctx=1: boom" in n for n in got.notes) == 2


def test_rounds_past_the_deadline_are_skipped_and_named(tmp_path):
    """A deadline already past: every round is skipped (now + estimate > deadline)."""
    got = _run(tmp_path, {"a": "ok"}, CELLS, deadline_s=-1.0)
    assert got.cells == []
    assert any(
        n.startswith(f"not run (time): {len(CELLS)} of {len(CELLS)} cells") for n in got.notes
    )


def test_round_estimate_uses_the_same_cell_shape_first():
    durations = {(1, 512): [0.5, 0.7], (32, 512): [3.0], (32, 8192): [9.0]}
    assert es.round_estimate(durations, (0.0, 1, 512, 3)) == 0.7
    assert es.round_estimate(durations, (1.0, 32, 2048, 0)) == 9.0
    assert es.round_estimate(durations, (0.0, 8, 512, 0)) == 0.0


@pytest.mark.parametrize("index,expected", [(0, "abc"), (1, "bca"), (5, "cab")])
def test_rotated(index, expected):
    assert "".join(es.rotated(list("abc"), index)) == expected
    assert es.rotated([], 3) == []
