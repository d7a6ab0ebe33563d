"""Windowing real vLLM attention-metadata objects (FlashAttention, Triton), CPU tensors."""

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")

from vllm.forward_context import get_forward_context, set_forward_context
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata

from dspark_compile.integrations.vllm import (
    StepWindows, WindowBuffers, kernel_block_size, window_attention_metadata)
from dspark_compile.window import windowed_len_bound
from tests.vllm_helpers import cpu_vllm_config

BLOCK, HEADS = 16, 2


def _batch(seq_lens, width=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    num_reqs = seq_lens.shape[0]
    table = torch.randint(1, 1000, (num_reqs, width), generator=gen, dtype=torch.int32)
    q_lens = torch.clamp(seq_lens, max=3)
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(q_lens, 0)
    num_tokens = int(query_start_loc[-1])
    slot_mapping = torch.randint(0, 1000 * BLOCK, (num_tokens,), generator=gen)
    return seq_lens, table, query_start_loc, slot_mapping, num_tokens


def flash_metadata(seq_lens, width=12, seed=0, **extra):
    seq_lens, table, qsl, slots, num_tokens = _batch(seq_lens, width, seed)
    return FlashAttentionMetadata(
        num_actual_tokens=num_tokens, max_query_len=3, query_start_loc=qsl,
        max_seq_len=int(seq_lens.max()) if len(seq_lens) else 0, seq_lens=seq_lens,
        block_table=table, slot_mapping=slots, **extra)


def triton_metadata(seq_lens, width=12, seed=0, **extra):
    seq_lens, table, qsl, slots, num_tokens = _batch(seq_lens, width, seed)
    return TritonAttentionMetadata(
        num_actual_tokens=num_tokens, max_query_len=3, query_start_loc=qsl,
        max_seq_len=int(seq_lens.max()) if len(seq_lens) else 0, seq_lens=seq_lens,
        block_table=table, slot_mapping=slots, seq_threshold_3D=4, num_par_softmax_segments=16,
        softmax_segm_output=torch.empty(num_tokens, HEADS, 16, 16),
        softmax_segm_max=torch.empty(num_tokens, HEADS, 16),
        softmax_segm_expsum=torch.empty(num_tokens, HEADS, 16), causal=True, **extra)


def buffers(window, future_offset=0, max_num_reqs=8):
    return WindowBuffers(window, BLOCK, future_offset, max_num_reqs, torch.device("cpu"),
                         torch.int32, torch.int32)


def expected_window(seq_lens, table, window, future_offset):
    """Independent per-request loop: what the windowed fields must hold."""
    width = -(-window // BLOCK) + 1
    lens, rows = [], []
    for i, seq_len in enumerate(seq_lens.tolist()):
        start = max(seq_len + future_offset - window, 0) // BLOCK * BLOCK
        lens.append(seq_len - start)
        needed = -(-(seq_len - start) // BLOCK)
        first = start // BLOCK
        row = [int(table[i, first + j]) if j < needed and first + j < table.shape[1] else 0
               for j in range(width)]
        rows.append(row)
    return (torch.tensor(lens, dtype=torch.int32),
            torch.tensor(rows, dtype=torch.int32).reshape(len(rows), width))


# Edge cases: long requests, seq_len < block, window larger than the sequence,
# W not a multiple of b, an empty batch.
CASES = [
    ([700, 5, 64, 17, 100], 100, 0),
    ([700, 5, 64, 17, 100], 100, 3),
    ([33, 1, 190], 2048, 0),
    ([191, 160], 48, 2),
    ([], 64, 0),
]


@pytest.mark.parametrize("make", [flash_metadata, triton_metadata], ids=["flash", "triton"])
@pytest.mark.parametrize("seq_lens,window,future_offset", CASES)
def test_fields_windowed_slot_mapping_untouched(make, seq_lens, window, future_offset):
    metadata = make(seq_lens, seed=len(seq_lens) + window)
    before = (metadata.seq_lens.clone(), metadata.block_table.clone(), metadata.max_seq_len)
    out = window_attention_metadata(metadata, buffers(window, future_offset))
    lens, table = expected_window(metadata.seq_lens, metadata.block_table, window, future_offset)
    assert torch.equal(out.seq_lens, lens)
    assert torch.equal(out.block_table, table)
    assert out.max_seq_len == min(before[2], windowed_len_bound(window, BLOCK, future_offset))
    assert out.slot_mapping is metadata.slot_mapping
    assert out.query_start_loc is metadata.query_start_loc
    assert out.num_actual_tokens == metadata.num_actual_tokens
    # the original object is left as it was (the target may share its tensors)
    assert torch.equal(metadata.seq_lens, before[0])
    assert torch.equal(metadata.block_table, before[1])
    assert metadata.max_seq_len == before[2]


def test_triton_scratch_and_plan_fields_shared():
    metadata = triton_metadata([300, 40])
    out = window_attention_metadata(metadata, buffers(64))
    assert out.softmax_segm_output is metadata.softmax_segm_output
    assert out.seq_threshold_3D == metadata.seq_threshold_3D
    assert out.causal is metadata.causal


def test_flash_aot_schedule_dropped_for_replanning():
    schedule = torch.arange(7, dtype=torch.int32)
    metadata = flash_metadata([300, 40], scheduler_metadata=schedule, max_num_splits=4)
    out = window_attention_metadata(metadata, buffers(64))
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
        window_attention_metadata(metadata, buffers(64))


def test_other_backend_metadata_raises():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

    with pytest.raises(TypeError, match="CPUAttentionMetadata cannot be windowed.*"
                                        "FLASH_ATTN, TRITON_ATTN"):
        window_attention_metadata(object.__new__(CPUAttentionMetadata), buffers(64))


def test_kernel_block_size_reads_logical_layout():
    assert kernel_block_size(torch.empty(3, 2, 32, 16)) == 32
    with pytest.raises(ValueError, match=r"shape \(3, 32, 16\)"):
        kernel_block_size(torch.empty(3, 32, 16))


@pytest.fixture(scope="module")
def vllm_config():
    return cpu_vllm_config()


def test_once_per_metadata_per_step_buffers_reused(vllm_config):
    windows = StepWindows()
    cache = torch.empty(4, 2, BLOCK, 32)
    ptrs = []
    for step, lens in enumerate(([300, 40, 77], [316, 41, 78])):
        group_a = triton_metadata(lens, seed=step)
        group_b = triton_metadata(lens, seed=step + 10)
        with set_forward_context({}, vllm_config):
            context = get_forward_context()
            a1 = windows.windowed(context, "draft.0", group_a, cache, 64, 0)
            a2 = windows.windowed(context, "draft.1", group_a, cache, 64, 0)  # same group
            b1 = windows.windowed(context, "draft.2", group_b, cache, 64, 0)  # other group
        assert a1 is a2
        assert b1 is not a1
        assert a1.block_table.data_ptr() != b1.block_table.data_ptr()  # no aliasing
        lens_a, table_a = expected_window(group_a.seq_lens, group_a.block_table, 64, 0)
        lens_b, table_b = expected_window(group_b.seq_lens, group_b.block_table, 64, 0)
        assert torch.equal(a1.seq_lens, lens_a) and torch.equal(a1.block_table, table_a)
        assert torch.equal(b1.seq_lens, lens_b) and torch.equal(b1.block_table, table_b)
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
        first = windows.windowed(get_forward_context(), "draft.0", metadata, cache, 64, 0)
        first_lens = first.seq_lens.clone()
    metadata.seq_lens += 20
    with set_forward_context({}, vllm_config):
        second = windows.windowed(get_forward_context(), "draft.0", metadata, cache, 64, 0)
    expected, _ = expected_window(metadata.seq_lens, metadata.block_table, 64, 0)
    assert torch.equal(second.seq_lens, expected)
    assert not torch.equal(first_lens, expected)


def test_buffers_grow_past_capacity(vllm_config):
    windows = StepWindows()
    cache = torch.empty(4, 2, BLOCK, 32)
    many = vllm_config.scheduler_config.max_num_seqs + 3
    metadata = triton_metadata([100 + i for i in range(many)], width=10)
    with set_forward_context({}, vllm_config):
        out = windows.windowed(get_forward_context(), "draft.0", metadata, cache, 32, 0)
    lens, table = expected_window(metadata.seq_lens, metadata.block_table, 32, 0)
    assert torch.equal(out.seq_lens, lens) and torch.equal(out.block_table, table)

