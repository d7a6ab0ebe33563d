"""The pure parts of ``benchmarks/diagnose_engine.py``: where greedy output first
differs, the target's margin there, and the profiler's launch counts."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import diagnose_engine as de  # noqa: E402


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 5, 3], 1),
        ([4, 2], [1, 2], 0),
        ([1, 2, 3], [1, 2], 2),  # shorter output differs at its end
        ([], [], None),
    ],
)
def test_first_difference(a, b, expected):
    assert de.first_difference(a, b) == expected


def test_flip_margin_is_the_targets_logprob_gap_at_the_first_differing_token():
    reference = [5, 6, 7]
    other = [5, 6, 9]
    logprobs = [{5: -0.1, 1: -3.0}, {6: -0.2, 2: -2.0}, {7: -0.70, 9: -0.71, 3: -4.0}]
    row = de.flip_margin(logprobs, reference, other)
    assert row["position"] == 2
    assert (row["reference_token"], row["token"]) == (7, 9)
    assert row["margin"] == pytest.approx(0.01)
    assert de.flip_margin(logprobs, reference, list(reference)) is None


def test_flip_margin_bounds_a_token_outside_the_top_k():
    logprobs = [{5: -0.5, 1: -1.5, 2: -2.5}]
    row = de.flip_margin(logprobs, [5], [8])
    assert row["margin"] is None
    assert row["margin_at_least"] == pytest.approx(2.0)


def test_top_margins_and_quantiles():
    margins = de.top_margins([{1: -0.1, 2: -1.1}, {3: -0.5}, {4: -0.2, 5: -0.3, 6: -2.0}])
    assert margins == pytest.approx([1.0, 0.1])
    q = de.quantiles([float(i) for i in range(100)])
    assert (q["p1"], q["p10"], q["p50"]) == (1.0, 10.0, 50.0)
    assert de.quantiles([]) == {}


def test_launch_counts_sum_the_runtime_calls():
    events = [
        SimpleNamespace(key="cudaGraphLaunch", count=12, self_cpu_time_total=240.0),
        SimpleNamespace(key="cudaLaunchKernel", count=30, self_cpu_time_total=90.0),
        SimpleNamespace(key="cuLaunchKernel", count=10, self_cpu_time_total=10.0),
        SimpleNamespace(key="aten::mm", count=99, self_cpu_time_total=1e6),
    ]
    counts = de.launch_counts(events)
    assert counts["graph_launches"] == {"count": 12, "cpu_ms": pytest.approx(0.24)}
    assert counts["kernel_launches"] == {"count": 40, "cpu_ms": pytest.approx(0.1)}
    assert counts["synchronizations"]["count"] == 0


def test_analyse_counts_identical_requests_and_reports_each_flip():
    nospec = {
        "greedy": {
            "64": [
                {
                    "tokens": [1, 2, 3],
                    "logprobs": [{1: -0.1, 9: -2}, {2: -0.1, 9: -3}, {3: -0.4, 4: -0.41}],
                },
                {"tokens": [7, 7], "logprobs": [{7: -0.1, 8: -1}, {7: -0.1, 8: -1}]},
            ]
        }
    }
    w1x = {"greedy": {"64": [{"tokens": [1, 2, 4]}, {"tokens": [7, 7]}]}, "profile": None}
    analysis = de.analyse({"nospec": nospec, "w1x": w1x})
    row = analysis["settings"]["w1x"]
    assert (row["identical"], row["requests"]) == (1, 2)
    assert row["flips"][0]["position"] == 2
    assert row["flips"][0]["margin"] == pytest.approx(0.01)
    assert analysis["positions"] == 5
    md = de.markdown(
        {
            "device": "cpu",
            "date_utc": "now",
            "git_commit": "abc",
            "versions": {"vllm": "x"},
            "family": "draft_model",
            "num_speculative_tokens": 5,
            "dtype": "float32",
            "profile_context": 64,
            "new_tokens": 3,
        },
        analysis,
    )
    assert "| w1x | 1/2 | ctx 64 #0 @2: 0.0100 |" in md
