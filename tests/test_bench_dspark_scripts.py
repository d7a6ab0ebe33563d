"""benchmarks/bench_dspark_kernels.py, bench_peer_attention.py, bench_mla_gluon_variants.py,
bench_markov_variants.py, profile_kernels.py and simulate_markov_filter.py:
argument parsing and the no-GPU exit (their measurements need a CUDA device; results are under
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
    assert (
        first.group,
        first.block_h,
        first.block_n,
        first.num_warps,
        first.num_stages,
        first.num_splits,
    ) == (4, 16, 64, 8, 2, None)
    assert (second.group, second.num_splits) == (2, 2)
    (narrow,) = bench.parse_mla_configs("4,16,64,8,2,0,64")
    assert narrow.scan_block == 64 and first.scan_block == 2048
    for bad in ("4,16", "4,16,64,8,2,0,64,1", "4,16,x,8,2,0"):
        with pytest.raises(ValueError, match=f"--mla-configs entry '{bad}' is invalid"):
            bench.parse_mla_configs(bad)


def test_mla_arithmetic_and_the_read_share_it_allows():
    """FLOPs per listed (token, slot) pair and head: a 576-wide score dot plus a
    512-wide value row, 2 FLOPs per multiply-add; a compute-bound shape cannot
    reach the read ceiling."""
    bench = _load("bench_dspark_kernels")
    assert bench.mla_flops(1, 1, 512, 64) == 2 * (576 + 512)
    listed = 64 * 8 * 2056  # the benchmark's non-causal rows
    flops = bench.mla_flops(listed, 16, 512, 64)
    assert flops == 2 * 64 * 8 * 16 * 2056 * 1088
    kv_bytes = 64 * 2056 * 1152
    share = bench.best_read_fraction(flops, kv_bytes, tflops=989.0, gbps=4495.0)
    assert 0.90 < share < 0.92  # 33.7 us of reads vs 37.1 us of math
    assert bench.best_read_fraction(1e6, kv_bytes, tflops=989.0, gbps=4495.0) == 1.0


def test_markov_launches_parse():
    bench = _load("bench_dspark_kernels")
    assert bench.parse_markov_launches("4096,8,1;2048,4;1024,4,0,2") == [
        (4096, 8, 1, None),
        (2048, 4, None, None),
        (1024, 4, None, 2),
    ]
    with pytest.raises(ValueError, match="--markov-launches entry '4096' is invalid"):
        bench.parse_markov_launches("4096")


def test_head_launches_parse_into_keywords():
    variants = _load("bench_markov_variants")
    assert variants.parse_head_launches("32,4,16,3;64,0,8,2,0") == [
        {"block_v": 32, "num_warps": 4, "tiles_per_program": 16, "num_stages": 3},
        {"block_v": 64, "tiles_per_program": 8, "num_stages": 2, "filter_upper": False},
    ]
    for bad in ("32,4,16", "32,4,16,3,1,1", "32,x,16,3"):
        with pytest.raises(ValueError, match=f"--head-launches entry '{bad}' is invalid"):
            variants.parse_head_launches(bad)


def test_a_baseline_kernel_file_loads_as_its_own_module():
    """``--baseline OLD.py``: the file is imported beside this checkout's module, not
    instead of it."""
    from dspark_compile.kernels import markov_sampling_triton as current

    bench = _load("bench_dspark_kernels")
    old = bench.load_module_file(current.__file__, "markov_baseline")
    assert old is not current and old.__name__ == "markov_baseline"
    assert old.sample_sequential_triton is not current.sample_sequential_triton
    assert old.BLOCK_V == current.BLOCK_V


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
@pytest.mark.parametrize(
    "name",
    [
        "bench_dspark_kernels",
        "bench_peer_attention",
        "bench_mla_gluon_variants",
        "bench_markov_variants",
        "bench_mla_copy_bound",
    ],
)
def test_scripts_exit_2_without_a_gpu(name, tmp_path, capsys):
    assert _load(name).main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="runs the kernel on CPU tensors in the Triton interpreter; on a GPU "
    "the benchmark checks it against torch before timing it",
)
def test_copy_bound_kernels_reduce_each_programs_row():
    """bench_mla_copy_bound's plain-Triton loads-only kernel (interpreter on CPU): each
    program stores the column maxima of its index row's KV rows, holes skipped; and
    ``expected_copies``' "once" mapping splits a row's tiles between two programs."""
    bench = _load("bench_mla_copy_bound")
    gen = torch.Generator().manual_seed(3)
    kv = torch.randn(3, 64, 576, generator=gen)
    kv[0, 0] = 100.0  # slot 0 is never listed: a hole read as it shows
    slots = (torch.randperm(191, generator=gen)[:150] + 1).to(torch.int32)
    idx = torch.full((8, 150), -1, dtype=torch.int32)
    idx[:4] = slots
    idx[4:, :70] = slots[:70]  # a shorter row, the rest holes
    got = bench.loads_only(kv, idx, stages=1)
    flat = kv.reshape(-1, 576)
    want = torch.stack([flat[r[r >= 0].long()].amax(0) for r in idx[::4]])
    assert torch.equal(got, want)
    once = bench.expected_copies(kv, idx, "once", 8)  # tiles 0-1 | 2: last tiles 1 and 2
    torch.testing.assert_close(once[0], flat[slots[64:128].long(), :512].sum(0))
    torch.testing.assert_close(once[1], flat[slots[128:].long(), :512].sum(0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_profile_script_checks_its_arguments_then_exits_2_without_a_gpu(capsys):
    profile = _load("profile_kernels")
    for case in ("mla", "mla-gluon", "mla-gluon-noloads"):
        assert profile.main([case]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    for bad in (["nope"], ["mla", "--calls", "0"]):
        with pytest.raises(SystemExit):
            profile.main(bad)
    assert "invalid choice: 'nope'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_peer_flush_mode_selects_the_timer(tmp_path):
    bench = _load("bench_peer_attention")
    assert bench.FLUSH["mode"] == "write"  # do_bench's zeroing flush
    assert bench.main(["--flush", "read", "--out", str(tmp_path)]) == 2
    assert bench.FLUSH["mode"] == "read"
    with pytest.raises(SystemExit):
        bench.main(["--flush", "zero"])


def test_peer_configs_parse_into_launch_knobs():
    bench = _load("bench_peer_attention")
    configs = bench.parse_configs("default; ppsm=4,bn=32 ;exact=1,heads=0,min_tokens=1024;")
    assert configs == [
        ("default", {}),
        ("ppsm=4,bn=32", {"programs_per_sm": 4, "block_n": 32}),
        (
            "exact=1,heads=0,min_tokens=1024",
            {"exact_tiles": True, "heads_first": False, "min_split_tokens": 1024},
        ),
    ]
    for bad in ("ppsm", "blocks=2", "bn=x"):
        with pytest.raises(ValueError, match="--configs"):
            bench.parse_configs(bad)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="runs the kernels on CPU tensors in the Triton interpreter; on a GPU "
    "the sweep itself runs (benchmarks/results/2026-11-30/*peer-attention-tuning*)",
)
@pytest.mark.parametrize("q_len", [1, 4])
def test_peer_sweep_checks_each_candidate_and_tabulates(q_len, monkeypatch):
    """The sweep at a toy size on the CPU (Triton interpreter; CUDA-graph timing
    stubbed): every candidate is checked against paged_attention_ref, a wrong
    one is reported and not timed, and the table has one row per candidate."""
    bench = _load("bench_peer_attention")
    monkeypatch.setattr(bench, "graph_ms", lambda fn: 0.001)
    monkeypatch.setattr(bench, "HQ", 8)
    monkeypatch.setattr(bench, "HKV", 2)
    monkeypatch.setattr(bench, "D", 16)
    batch, context, window = 2, 80, 32
    gen = torch.Generator().manual_seed(0)
    blocks = context // bench.BLOCK
    kc = torch.randn(batch * blocks + 3, bench.BLOCK, 2, 16, generator=gen)
    vc = torch.randn(kc.shape, generator=gen)
    table = torch.randperm(kc.shape[0], generator=gen)[: batch * blocks].view(batch, blocks)
    table = table.to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    qsl = torch.arange(batch + 1, dtype=torch.int32) * q_len
    query = torch.randn(batch * q_len, 8, 16, generator=gen)
    start = (context - window) // bench.BLOCK * bench.BLOCK
    configs = bench.parse_configs("default;ppsm=1,exact=1,heads=1;splits=3,bn=16")
    original = bench.rel_err
    calls = []

    def rel_err(got, want):  # the third candidate's full result is made wrong
        calls.append(1)
        return 1.0 if len(calls) == 7 else original(got, want)  # 3 checks per candidate

    monkeypatch.setattr(bench, "rel_err", rel_err)
    rows = bench.sweep_case(
        configs, query, kc, vc, table, seq_lens, qsl, 0.25, q_len == 1, window, start
    )
    assert [r["config"] for r in rows] == [c[0] for c in configs]
    assert all(
        r["err_full"] < 1e-4 and r["err_windowed"] < 1e-4 and r["err_in_kernel"] < 1e-4
        for r in rows[:2]
    )
    assert rows[0]["full_us"] == 1.0 and "error" not in rows[1]
    assert "rel. err" in rows[2]["error"] and "full_us" not in rows[2]
    assert "heads=1" in rows[1]["full_launch"] and "splits=3" in rows[2]["full_launch"]
    assert "heads=1" in rows[1]["in_kernel_launch"]
    result = {
        "batch": batch,
        "context": context,
        "q_len": q_len,
        "windowed_MB": 1.0,
        "sdpa_full_us": 2.0,
        "sweep": rows,
    }
    text = bench.sweep_table([result], ceiling=1000.0)
    assert text.count("\n| ") == 4 and "| 1: ppsm=1,exact=1,heads=1 | 1.0 (200%) |" in text


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="runs the kernels on CPU tensors in the Triton interpreter; on a GPU "
    "the benchmark itself runs it",
)
def test_peer_layer_step_times_per_layer_and_checks_layer_zero(monkeypatch):
    """The N-layer step at a toy size on the CPU (CUDA-graph timing stubbed): the
    graph's time is divided by N, and layer 0 must equal the one-call output."""
    bench = _load("bench_peer_attention")
    timed = []

    def graph_ms(fn):
        outs = fn()
        timed.append(len(outs))
        return 0.004

    monkeypatch.setattr(bench, "graph_ms", graph_ms)
    gen = torch.Generator().manual_seed(1)
    batch, context, window, hkv, dim = 2, 80, 32, 2, 16
    blocks = context // bench.BLOCK
    kc = torch.randn(batch * blocks + 3, bench.BLOCK, hkv, dim, generator=gen)
    vc = torch.randn(kc.shape, generator=gen)
    table = torch.randperm(kc.shape[0], generator=gen)[: batch * blocks].view(batch, blocks)
    table = table.to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    query = torch.randn(batch, 8, dim, generator=gen)
    in_kernel = torch.ops.dspark.paged_attention(
        query, kc, vc, table, seq_lens, qsl, 0.25, True, window_size=window
    )
    from dspark_compile.kernels.window_metadata import window_metadata_triton

    lens, _, win_table = window_metadata_triton(seq_lens, table, window, bench.BLOCK)
    windowed = torch.ops.dspark.paged_attention(query, kc, vc, win_table, lens, qsl, 0.25, True)
    res = bench.time_layers(
        3, query, kc, vc, table, seq_lens, qsl, 0.25, True, window, windowed, in_kernel
    )
    assert timed == [3, 3]
    assert res == {
        "layers": 3,
        "windowed_per_layer_us": pytest.approx(4 / 3),
        "in_kernel_per_layer_us": pytest.approx(4 / 3),
    }
    with pytest.raises(AssertionError, match="in_kernel: layer 0 of the 2-layer step differs"):
        bench.time_layers(
            2, query, kc, vc, table, seq_lens, qsl, 0.25, True, window, windowed, in_kernel + 1e-3
        )


def test_filter_simulation_classifies_a_programs_paths():
    """simulate_markov_filter.py: lane p of a 4-lane program sees tokens p, p + 4, ...;
    the pivot alone, two lanes' best tokens reaching it, one lane holding two."""
    sim = _load("simulate_markov_filter")
    exact = torch.tensor([0.0, 1.0, 2.0, 3.0, 9.0, 1.0, 2.0, 3.0])
    assert sim.classify(exact + 0.05, exact, block=4) == ("alone", 1)
    tied = exact.clone()
    tied[2] = 9.0  # lane 2's best reaches the pivot's value
    assert sim.classify(tied + 0.05, tied, block=4) == ("few", 2)
    crowded = exact.clone()
    crowded[0] = 8.99  # lane 0 holds 8.99 (second) and 9.0 (best)
    assert sim.classify(crowded + 0.05, crowded, block=4)[0] == "crowded"


def test_filter_simulation_counts_every_program(capsys):
    sim = _load("simulate_markov_filter")
    assert (
        sim.main(
            [
                "--requests",
                "3",
                "--steps",
                "1",
                "--vocab",
                "3000",
                "--span",
                "1024",
                "--block",
                "256",
            ]
        )
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("9 programs: ")  # 3 rows x 3 spans of 1024
    with pytest.raises(SystemExit):
        sim.main(["--block", "0"])


def test_filter_simulation_bound_holds_on_every_noise_input():
    """The simulation's float32 ``gumbel_upper`` (the kernel's formula) against the
    reference noise of ``gumbel_noise`` on all 2**23 inputs: never below it, and within
    0.07 of it where the noise is above 4 (as ``gumbel_upper_error`` finds in-kernel)."""
    from dspark_compile.kernels.markov_sampling import gumbel_from_bits

    sim = _load("simulate_markov_filter")
    bits = torch.arange(1 << 23, dtype=torch.int64) << 9
    exact = gumbel_from_bits(bits)
    upper = sim.gumbel_upper(bits)
    assert float((exact - upper).max()) <= 0.0
    tail = exact > 4.0
    assert 0.0 < float((upper - exact)[tail].max()) < 0.07
