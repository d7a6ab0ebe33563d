"""benchmarks/bench_draft_window.py: its code analysis and a tiny CPU run of main()."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_draft_window.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_draft_window", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WRAPPER = """
def call(args):
    triton_poi_fused_0.run(arg4_1, arg3_1, buf0, buf1, 8, stream=stream0)
    buf2 = torch.ops.dspark.paged_attention.default(reinterpret_tensor(buf9, (4, 2), (1, 1), 0), arg1_1, arg2_1, buf1, buf0, 0.1, False)
    buf3 = torch.ops.dspark.paged_attention.default(buf7, arg1_1, arg2_1, buf1, buf0, 0.1, False)
"""  # noqa: E501  (a verbatim line of Inductor's output code)


def test_window_kernel_analysis(bench):
    info = bench.analyse_window_kernels(WRAPPER)
    assert info["attention_calls"] == 2 and info["one_kernel_for_all_layers"]
    assert info["producers"] == {"triton_poi_fused_0": {"launches": 1, "outputs": ["buf0", "buf1"]}}
    two = WRAPPER.replace("buf0, buf1, 8", "buf1, 8").replace(
        "    buf2", "    triton_poi_fused_1.run(arg4_1, buf0, 4, stream=stream0)\n    buf2", 1
    )
    info = bench.analyse_window_kernels(two)
    assert not info["one_kernel_for_all_layers"] and len(info["producers"]) == 2


def test_main_runs_tiny_sections_on_cpu(tmp_path):
    # A fresh process with the Triton interpreter on and no GPU visible, so the
    # kernels are decorated for the interpreter whatever machine runs the suite.
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(SCRIPT.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke-cpu",
            "--sections",
            "correct,meta",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["status"] == {"correct": True}
    assert all(row[-1] == "PASS" for row in data["sections"]["correct"]["rows"])
    assert data["sections"]["meta"]["exact"] is True
    assert "## 1. Correctness at real sizes" in (tmp_path / "results.md").read_text()


def test_unknown_section_is_rejected(bench):
    with pytest.raises(SystemExit):
        bench.main(["--sections", "speed"])


def test_sinks_section_runs_on_cpu(tmp_path):
    """--sections sinks --sink-size: a tiny CPU run (the script only; the GPU run
    checks the Triton kernels against the reference)."""
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(SCRIPT.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke-cpu",
            "--sections",
            "sinks",
            "--sink-size",
            "16,40",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    section = json.loads((tmp_path / "results.json").read_text())["sections"]["sinks"]
    assert section["all_pass"] and [row[1] for row in section["rows"]] == [0, 16, 40] * 2
    assert [row[2] for row in section["rows"]] == [0, 1, 3] * 2


def test_bad_sink_size_is_rejected(bench):
    with pytest.raises(SystemExit):
        bench.main(["--sections", "sinks", "--sink-size", "16,x"])
