"""``kernels.compiled_launch.CompiledLaunches``: the first call of a key goes through the
JIT, later calls through the compiled variant once its check passed; a failed check or a
raising launcher sends the key back to the JIT for good. A recording stand-in plays the
JIT and its compiled variant here; on a GPU the real kernel is used (last test)."""

from __future__ import annotations

import logging

import pytest
import torch

from dspark_compile.kernels import compiled_launch
from dspark_compile.kernels.compiled_launch import CompiledLaunches, fits_int32


class _Variant:
    def __init__(self, log: list, fail: bool = False) -> None:
        self.log, self.fail = log, fail

    def __getitem__(self, grid):
        def run(*args):
            if self.fail:
                raise TypeError("launcher takes other arguments")
            self.log.append(("direct", grid, args))

        return run


class _Jit:
    """``kernel[grid](*args)`` as Triton's JIT: records the launch, returns the variant."""

    def __init__(self, fail_direct: bool = False) -> None:
        self.log: list = []
        self.variant = _Variant(self.log, fail_direct)

    def __getitem__(self, grid):
        def run(*args):
            self.log.append(("jit", grid, args))
            return self.variant

        return run


@pytest.fixture(autouse=True)
def variants_are_compiled(monkeypatch):
    monkeypatch.setattr(compiled_launch, "_is_compiled", lambda k: isinstance(k, _Variant))


def _paths(log):
    return [entry[0] for entry in log]


def test_first_call_jit_then_direct_after_one_check():
    jit = _Jit()
    launches = CompiledLaunches(jit, "k")
    checks = []
    for i in range(4):
        launches.launch(("a",), (i + 1,), (i, "x"), check=lambda: checks.append(1) or True)
    assert _paths(jit.log) == ["jit", "direct", "direct", "direct"]
    assert [entry[1] for entry in jit.log] == [(1,), (2,), (3,), (4,)]
    assert [entry[2] for entry in jit.log][-1] == (3, "x")
    assert checks == [1]  # only the first direct launch is checked
    assert launches.direct_keys() == {("a",)} and not launches.jit_only_keys()


def test_keys_are_separate_variants():
    jit = _Jit()
    launches = CompiledLaunches(jit, "k")
    for key in ("a", "b", "a", "b"):
        launches.launch(key, (1,), ())
    assert _paths(jit.log) == ["jit", "jit", "direct", "direct"]


def test_a_failed_check_sends_the_key_back_to_the_jit(caplog):
    jit = _Jit()
    launches = CompiledLaunches(jit, "query_table")
    with caplog.at_level(logging.WARNING, logger=compiled_launch.__name__):
        for _ in range(3):
            launches.launch("a", (1,), (), check=lambda: False)
    # the disagreeing direct launch is redone by the JIT, and the JIT keeps the key
    assert _paths(jit.log) == ["jit", "direct", "jit", "jit"]
    assert launches.jit_only_keys() == {"a"} and not launches.direct_keys()
    assert "query_table: the direct launch of variant a disagreed" in caplog.text


def test_a_raising_launcher_sends_the_key_back_to_the_jit(caplog):
    jit = _Jit(fail_direct=True)
    launches = CompiledLaunches(jit, "k")
    with caplog.at_level(logging.WARNING, logger=compiled_launch.__name__):
        for _ in range(3):
            launches.launch("a", (1,), ())
    assert _paths(jit.log) == ["jit", "jit", "jit"]
    assert launches.jit_only_keys() == {"a"}
    assert "raised TypeError('launcher takes other arguments')" in caplog.text


def test_an_unchecked_key_takes_the_jit_while_a_graph_is_captured(monkeypatch):
    jit = _Jit()
    launches = CompiledLaunches(jit, "k")
    launches.launch("a", (1,), ())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    launches.launch("a", (1,), (), check=lambda: pytest.fail("no check during capture"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    launches.launch("a", (1,), ())
    launches.launch("a", (1,), ())
    assert _paths(jit.log) == ["jit", "jit", "direct", "direct"]


def test_a_jit_without_compiled_variants_is_always_called():
    """Under TRITON_INTERPRET the JIT returns no ``CompiledKernel``."""
    log = []

    class Interpreted:
        def __getitem__(self, grid):
            return lambda *args: log.append(grid)

    launches = CompiledLaunches(Interpreted(), "k")
    for i in range(3):
        launches.launch("a", (i,), ())
    assert log == [(0,), (1,), (2,)] and launches.jit_only_keys() == {"a"}


def test_direct_off_always_takes_the_jit():
    jit = _Jit()
    launches = CompiledLaunches(jit, "k", direct=False)
    for _ in range(3):
        launches.launch("a", (1,), ())
    assert _paths(jit.log) == ["jit"] * 3 and not launches.direct_keys()


def test_fits_int32():
    assert fits_int32(0, -(2**31), 2**31 - 1)
    assert not fits_int32(3, 2**31)
    assert not fits_int32(-(2**31) - 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled variant needs a GPU")
def test_the_window_table_kernel_launches_directly_on_a_gpu():
    """The real kernel: after its first (JIT) launch, later calls of the same dtypes go
    straight to the compiled variant, pass its check, and give the reference's values
    for other shapes, strides and lengths."""
    from dspark_compile.arithmetic.window import first_query_window_table
    from dspark_compile.kernels import query_window_table

    gen = torch.Generator().manual_seed(3)
    for num_reqs, width, stride in ((3, 20, 1), (7, 40, 2), (1, 9, 3), (32, 64, 1)):
        seq_lens = torch.randint(1, width * 16, (num_reqs,), generator=gen, dtype=torch.int32)
        q_lens = torch.clamp(seq_lens, max=4)
        qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(q_lens, 0)
        wide = torch.randint(1, 10**6, (num_reqs, width * stride), generator=gen, dtype=torch.int32)
        table = wide[:, ::stride]
        seq_lens, qsl, table = seq_lens.cuda(), qsl.cuda(), table.cuda()
        got = (
            torch.full((num_reqs,), -7, device="cuda", dtype=torch.int32),
            torch.full((num_reqs, 11), -7, device="cuda", dtype=torch.int32),
        )
        want = (torch.empty_like(got[0]), torch.empty_like(got[1]))
        query_window_table.query_window_table_triton(seq_lens, qsl, table, 100, 16, *got)
        first_query_window_table(seq_lens, qsl, table, 100, 16, *want)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    launches = query_window_table._QUERY_TABLE_LAUNCHES
    assert launches.direct_keys() and not launches.jit_only_keys()
