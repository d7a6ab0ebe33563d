"""``python -m dspark_research`` (the research commands, run from the checkout): the
demo with its acceptance part, bench; study and study-report are in tests/test_study.py."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark_research import cli

ROOT = Path(__file__).resolve().parent.parent


def test_module_entry_point_help_from_the_checkout():
    result = subprocess.run(
        [sys.executable, "-m", "dspark_research", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for command in ("demo", "bench", "study", "study-report"):
        assert command in result.stdout


@pytest.mark.parametrize("command", ["demo", "bench", "study", "study-report"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m dspark_research {command}" in out
    if command == "demo":  # the library's demo options plus the acceptance part's
        assert "--contexts" in out and "--pair-dir" in out and "--skip-pair" in out


def test_bad_values_exit_2_with_one_line(capsys):
    assert cli.main(["demo", "--draft", "dspark", "--draft-sink-size", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "python -m dspark_research demo: error: --draft-sink-size=16 is invalid with "
        "--draft dspark: the DSpark demo has no sink option (use --draft dflash)"
    )


def test_demo_runs_the_compile_table_then_the_acceptance_part(monkeypatch, capsys):
    """The library's demo table (for real, one small context), then the pair part (its
    rows from ``run_pair_demo``, tested for real in tests/test_pair_demo.py)."""
    from dspark_research import pair_demo

    rows = [
        pair_demo.PairRow(64, 64, 1.98, 2.18, 60, True),
        pair_demo.PairRow(1024, 64, 1.63, 2.33, 55, True),
    ]
    monkeypatch.setattr(pair_demo, "run_pair_demo", lambda *a, **k: iter(rows))
    argv = ["demo", "--contexts", "80", "--window", "32", "--requests", "2"]
    assert cli.main([*argv, "--lowering", "aot_eager"]) == 0
    out = capsys.readouterr().out
    assert out.index("OK: compiled outputs match the eager references") < out.index(
        "acceptance on a trained pair"
    )
    assert "OK: the window changes no token" in out
    rows[1] = pair_demo.PairRow(1024, 64, 1.63, 2.33, 55, False)
    assert cli.main([*argv, "--lowering", "aot_eager"]) == 1  # the pair part's status counts
    assert "MISMATCH: the generated tokens differ" in capsys.readouterr().out
    assert cli.main([*argv, "--lowering", "aot_eager", "--skip-pair"]) == 0
    assert "acceptance on a trained pair" not in capsys.readouterr().out


def test_bench_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "--sizes", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m dspark_research bench: error: no CUDA device: the benchmarks time GPU kernels "
        "(torch.cuda.is_available() is False)"
    )


def test_bench_without_the_script(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "BENCH_SCRIPT", tmp_path / "missing.py")
    assert cli.main(["bench"]) == 2
    assert "benchmark script not found at" in capsys.readouterr().err


def test_bench_passes_its_arguments_to_the_script(monkeypatch, tmp_path):
    script = tmp_path / "bench_draft_window.py"
    record = tmp_path / "argv.txt"
    script.write_text(
        f"def main(argv):\n    open({str(record)!r}, 'w').write(repr(argv))\n    return 3\n"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "BENCH_SCRIPT", script)
    assert cli.main(["bench", "--contexts", "4096", "--window", "512"]) == 3
    assert record.read_text() == repr(["--contexts", "4096", "--window", "512"])
    assert cli.main(["bench", "--", "--help"]) == 3
    assert record.read_text() == repr(["--help"])


def test_demo_acceptance_part_prints_tau_both_ways(monkeypatch, capsys):
    """The CLI's table of the pair part (rows from ``run_pair_demo``, tested for real in
    tests/test_pair_demo.py), its summary line and its exit status."""
    from dspark_research import pair_demo

    rows = [
        pair_demo.PairRow(64, 64, 1.98, 2.18, 60, True),
        pair_demo.PairRow(1024, 64, 1.63, 2.33, 55, True),
    ]
    monkeypatch.setattr(pair_demo, "run_pair_demo", lambda *a, **k: iter(rows))
    assert cli.run_pair_demo_command(None, "aot_eager") == 0
    out = capsys.readouterr().out
    assert "draft_model draft trained at 64 tokens" in out
    table = [line.split("|") for line in out.splitlines() if line.strip().startswith("1024 |")]
    assert [c.strip() for c in table[0][:4]] == ["1024", "1.63", "2.33", "64"]
    assert table[0][4].split() == ["True", "[2/2]"]
    assert "at 1024 tokens (16x the draft's training context) tau is 1.63 without" in out
    rows[1] = pair_demo.PairRow(1024, 64, 1.63, 2.33, 55, False)
    assert cli.run_pair_demo_command(None, "aot_eager") == 1
    out = capsys.readouterr().out
    assert "MISMATCH: the generated tokens differ from the target's own greedy decode" in out


def test_demo_acceptance_part_without_a_pair(monkeypatch, tmp_path, capsys):
    from dspark_research import pair_demo

    monkeypatch.setattr(pair_demo, "PAIR_DIR", tmp_path / "absent")
    assert cli.run_pair_demo_command(None, "aot_eager") == 0
    assert "acceptance part skipped: no trained pair at" in capsys.readouterr().out
    with pytest.raises(cli.UsageError, match=r"--pair-dir='.*absent' is invalid: expected a"):
        cli.run_pair_demo_command(tmp_path / "absent", "aot_eager")
