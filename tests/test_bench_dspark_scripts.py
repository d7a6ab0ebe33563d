"""benchmarks/bench_dspark_kernels.py and bench_peer_attention.py: argument parsing and
the no-GPU exit (their measurements need a CUDA device; results are under
benchmarks/results/)."""

import importlib.util
import pathlib

import pytest
import torch

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mla_configs_parse_into_launch_shapes():
    bench = _load("bench_dspark_kernels")
    first, second = bench.parse_mla_configs("4,16,64,8,2,0;2,8,32,4,3,2")
    assert (first.group, first.block_h, first.block_n, first.num_warps, first.num_stages,
            first.num_splits) == (4, 16, 64, 8, 2, None)
    assert (second.group, second.num_splits) == (2, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
@pytest.mark.parametrize("name", ["bench_dspark_kernels", "bench_peer_attention"])
def test_scripts_exit_2_without_a_gpu(name, tmp_path, capsys):
    assert _load(name).main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
