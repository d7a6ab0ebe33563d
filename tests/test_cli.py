"""The dspark-compile command line: commands, exit codes and messages."""

import subprocess
import sys
from pathlib import Path

import pytest

from dspark_compile.tools import cli

ROOT = Path(__file__).resolve().parent.parent


def test_module_entry_point_help():
    result = subprocess.run(
        [sys.executable, "-m", "dspark_compile", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    for command in ("demo", "inspect", "check-ascend"):
        assert command in result.stdout
    # the research commands are not the installed CLI's (python -m dspark_research)
    for command in ("bench", "study", "study-report"):
        assert command not in result.stdout


@pytest.mark.parametrize("command", ["demo", "inspect", "check-ascend"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"dspark-compile {command}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["demo", "--window", "0"], "argument --window: 0 is invalid: expected a positive int"),
        (["demo", "--contexts", "12x"], "argument --contexts: '12x' is not an int"),
        (["inspect", "--method", "medusa"], "argument --method: invalid choice: 'medusa'"),
        (["inspect", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_arguments_exit_2_with_one_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["inspect", "--window", "-3"], "--window=-3 is invalid: expected a positive int, or 0"),
        (
            ["inspect", "--window", "2", "--method", "eagle3", "--num-speculative-tokens", "3"],
            "future_offset=3 is invalid for draft_window_size=2",
        ),
        (["demo", "--device", "nonsense"], "--device='nonsense' is invalid"),
        (
            ["inspect", "--draft-sink-size", "-1"],
            "--draft-sink-size=-1 is invalid: expected an int",
        ),
        (
            ["check-ascend", "--window", "0", "--draft-sink-size", "16"],
            "--draft-sink-size=16 is invalid with --window=0",
        ),
        (["demo", "--draft-sink-size", "-4"], "--draft-sink-size=-4 is invalid"),
        (
            ["demo", "--draft", "dspark", "--draft-sink-size", "16"],
            "--draft-sink-size=16 is invalid with --draft dspark",
        ),
    ],
)
def test_bad_values_exit_2_with_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"dspark-compile {argv[0]}: error: ") and message in err[-1]
    assert not (tmp_path / "dspark_inspect").exists()


def test_demo_prints_the_table_and_succeeds(capsys):
    assert (
        cli.main(
            [
                "demo",
                "--contexts",
                "80",
                "--window",
                "32",
                "--requests",
                "2",
                "--lowering",
                "aot_eager",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "acceptance on a trained pair" not in captured.out  # dspark_research's part
    rows = [line for line in captured.out.splitlines() if line.strip().startswith("80 |")]
    assert len(rows) == 1
    assert rows[0].split("|")[4].strip() == "4"  # 4 layers rewritten
    assert "OK: compiled outputs match the eager references" in captured.out
    assert "demo [" in captured.err  # progress


def test_demo_counts_the_rewrites_also_when_inductor_caches_hit(tmp_path):
    """A second demo process (window demo, then DSpark demo) finds the compiled graphs in
    Inductor's on-disk caches (same cache directory); it must still run the passes and
    report their rewrites."""
    import os
    import subprocess
    import sys

    script = (
        "from dspark_compile.tools.demo import run_demo\n"
        "[row] = run_demo(context_lens=(80,), window_size=32, num_requests=2, repeats=1)\n"
        "print(row.rewritten_calls, row.window_computations)\n"
        "from dspark_compile.tools.dspark_demo import run_dspark_demo\n"
        "[row] = run_dspark_demo(context_lens=(80,), window_size=32, num_requests=2,\n"
        "                        repeats=1)\n"
        "print(row.rewritten_calls, row.tokens_equal, row.max_err < 1e-4)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split() == ["4", "1", "1", "True", "True"], (
            done.stdout + done.stderr[-3000:]
        )


def test_inspect_command_writes_the_dump(tmp_path, capsys):
    dump = tmp_path / "dump"
    assert (
        cli.main(
            [
                "inspect",
                "--dump-dir",
                str(dump),
                "--lowering",
                "aot_eager",
                "--context",
                "48",
                "--window",
                "16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "attention calls found 2, rewritten 2, window computations inserted 1" in out
    summary = (dump / "summary.md").read_text()
    assert "draft_window_size (W): 16" in summary
    assert "NPU-route graph" in summary  # eager lowering: the graph torchair would get
    assert "every inserted op is convertible by torchair's GE graph mode" in summary
    assert cli.main(["inspect", "--dump-dir", str(dump)]) == 2  # not empty
    assert "is not empty" in capsys.readouterr().err


def test_check_ascend_command(capsys):
    assert cli.main(["check-ascend", "--inserted-only", "--window", "16"]) == 0
    assert "convertible by torchair's GE graph mode" in capsys.readouterr().out
    assert cli.main(["check-ascend", "--window", "16"]) == 1  # the reference custom ops
    out = capsys.readouterr().out
    assert "torch.ops.dspark.paged_attention.default" in out


def test_demo_and_inspect_with_attention_sinks(tmp_path, capsys):
    assert (
        cli.main(
            [
                "demo",
                "--contexts",
                "80",
                "--window",
                "32",
                "--requests",
                "2",
                "--lowering",
                "aot_eager",
                "--draft-sink-size",
                "16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "W=32, S=16 sink tokens" in out
    assert "OK: compiled outputs match the eager references" in out
    dump = tmp_path / "dump"
    assert (
        cli.main(
            [
                "inspect",
                "--dump-dir",
                str(dump),
                "--lowering",
                "aot_eager",
                "--context",
                "48",
                "--window",
                "16",
                "--draft-sink-size",
                "20",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    # b = 16: S = 20 tokens -> 2 sink blocks; ceil(16/16) + 1 window columns + 2
    assert "attention sinks: S=20 tokens on 2 call(s); block table columns 3 -> 4" in out
    summary = (dump / "summary.md").read_text()
    assert "draft_sink_size (S): 20 tokens = 2 block(s) of b=16 (S_b = 32" in summary
    assert "block table 3 -> 4 columns" in summary
    assert "| with_sinks | 2 |" in summary
    assert "every inserted op is convertible by torchair's GE graph mode" in summary
    assert (
        cli.main(["check-ascend", "--inserted-only", "--window", "16", "--draft-sink-size", "20"])
        == 0
    )


def test_backend_name_resolves_without_an_installed_entry_point():
    """A source checkout that was never pip-installed has no entry point: importing
    the package must still make ``backend="dspark"`` resolve (to our backend)."""
    import os
    import subprocess
    import sys

    script = (
        "import importlib.metadata as metadata\n"
        "entry_points = metadata.entry_points\n"
        "def hidden(**kw):\n"
        "    if kw.get('group') == 'torch_dynamo_backends':\n"
        "        return metadata.EntryPoints(())\n"
        "    return entry_points(**kw)\n"
        "metadata.entry_points = hidden\n"
        "import torch\n"
        "import dspark_compile\n"
        "from torch._dynamo.backends.registry import lookup_backend\n"
        "assert lookup_backend('dspark') is dspark_compile.dspark_backend\n"
        "f = torch.compile(lambda x: x * 2 + 1, backend='dspark')\n"
        "print(f(torch.ones(3)).tolist())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "[3.0, 3.0, 3.0]", done.stdout
