"""``benchmarks/bench_route_host.py`` on the CPU: both kinds of step are timed and labelled
(the window cannot cut 640 tokens at W = 1024, K = 5, b = 16; it cuts 2048), and bad
options are named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_route_host  # noqa: E402


def test_times_a_kept_and_a_windowed_step(capsys, monkeypatch):
    from dspark_compile.integrations.vllm import token_window

    # the benchmark stubs the CPU table step on the module: undo it after the test
    monkeypatch.setattr(token_window, "_window_table_numpy", token_window._window_table_numpy)
    monkeypatch.setattr(token_window, "_window_table_torch", token_window._window_table_torch)
    assert bench_route_host.main(["--device", "cpu", "--iters", "3"]) == 0
    out = capsys.readouterr().out
    assert "context 640 (not cut: kept):" in out and "context 2048 (windowed):" in out
    assert out.count("route:") == 2 and out.count("vLLM's op:") == 2


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--contexts", "640,x"], "--contexts: '640,x': expected comma-separated ints"),
        (["--contexts", "0"], "--contexts: 0: expected 1 to 2048"),
        (["--iters", "0"], "--iters: 0: expected an int >= 1"),
    ],
)
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_route_host.main(argv + ["--device", "cpu"])
    assert message in capsys.readouterr().err
