"""DSpark CUDA kernels against their torch references: grouped sparse MLA attention,
the Triton latent-cache write and the fused Markov sampler (Triton interpreter on CPU,
compiled on CUDA), and CUDA-graph capture of the compiled DSpark draft step (GPU only)."""

import pytest
import torch

import dspark_compile  # noqa: F401  (registers torch.ops.dspark.*)
from dspark_compile.arithmetic.index_width import causal_width, noncausal_width
from dspark_compile.kernels import markov_sampling_triton as markov_triton, sparse_mla as ref
from dspark_compile.kernels.markov_sampling_triton import sample_sequential_triton
from dspark_compile.kernels.mla_cache_write_triton import mla_cache_write_triton
from dspark_compile.kernels.sparse_mla_grouped_triton import (
    GroupedMLAConfig,
    grouped_sparse_mla_attention_triton,
)
from dspark_compile.models import DSparkMarkovHead, make_paged_batch, sample_sequential

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _index_args(batch):
    return batch.seq_lens, batch.query_start_loc, batch.block_table, batch.slot_mapping


def _mla_case(
    seq_lens, q_lens, block_size, window, heads, lora, rope, noncausal, seed, dtype=torch.float32
):
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged_batch(seq_lens, q_lens, block_size, generator=gen)
    width = noncausal_width(window, max(q_lens)) if noncausal else causal_width(window)
    fn = ref.noncausal_swa_indices_ref if noncausal else ref.swa_indices_ref
    indices = fn(*_index_args(batch), block_size, window, width)
    query = torch.randn(batch.num_tokens, heads, lora + rope, generator=gen).to(dtype)
    kv_cache = torch.randn(batch.num_blocks, block_size, lora + rope, generator=gen).to(dtype)
    return query, kv_cache, indices


# (seq_lens, q_lens, b, W, heads, lora, rope, config): an empty request, seq_len < b,
# W larger than the sequence, W not a multiple of b, q_len not a multiple of the group
# (groups straddle two requests), heads not a power of two, splits that leave a
# split partly or wholly past the live columns.
GROUPED_CASES = [
    ([21, 9, 0, 3, 40], [4, 4, 0, 3, 5], 4, 8, 3, 32, 16, GroupedMLAConfig(block_n=16)),
    (
        [21, 9, 0, 3, 40],
        [4, 4, 0, 3, 5],
        4,
        8,
        3,
        32,
        16,
        GroupedMLAConfig(block_n=16, num_splits=3),
    ),
    ([150, 40], [8, 8], 5, 128, 4, 16, 8, GroupedMLAConfig(group=4, block_n=32, num_splits=4)),
    ([12, 20], [4, 4], 4, 100, 2, 16, 16, GroupedMLAConfig(group=8, block_n=16, num_splits=2)),
    # the pre-scan in 16-column steps (several steps, the last one partial)
    (
        [21, 9, 0, 3, 40],
        [4, 4, 0, 3, 5],
        4,
        8,
        3,
        32,
        16,
        GroupedMLAConfig(block_n=16, num_splits=2, scan_block=16),
    ),
    # a scan step wider than the rows
    ([150, 40], [8, 8], 5, 128, 4, 16, 8, GroupedMLAConfig(block_n=32, scan_block=1024)),
]


@pytest.mark.parametrize("noncausal", [True, False])
@pytest.mark.parametrize("seq_lens,q_lens,b,window,heads,lora,rope,config", GROUPED_CASES)
def test_grouped_sparse_mla_matches_reference(
    noncausal, seq_lens, q_lens, b, window, heads, lora, rope, config
):
    query, kv_cache, indices = _mla_case(
        seq_lens, q_lens, b, window, heads, lora, rope, noncausal, seed=sum(seq_lens) + window
    )
    scale = (lora + rope) ** -0.5
    want = ref.sparse_mla_attention_ref(query.double(), kv_cache.double(), indices, scale, lora)
    got = grouped_sparse_mla_attention_triton(
        query.to(DEVICE), kv_cache.to(DEVICE), indices.to(DEVICE), scale, lora, config
    ).cpu()
    assert got.shape == want.shape and got.dtype == query.dtype
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_grouped_launch_that_does_not_fit_retries_smaller_shapes(monkeypatch):
    """A GPU with less shared memory than the launch needs: the grouped kernel
    retries with fewer stages, then smaller tiles (``_smaller``), same result."""
    import triton

    from dspark_compile.kernels import sparse_mla_grouped_triton as grouped

    query, kv_cache, indices = _mla_case([21, 40], [4, 5], 4, 8, 3, 32, 16, True, seed=5)
    scale = 48**-0.5
    want = ref.sparse_mla_attention_ref(query.double(), kv_cache.double(), indices, scale, 32)
    real_launch, tried = grouped._launch, []

    def small_gpu(*args):
        cfg = args[-1]
        tried.append((cfg.block_n, cfg.num_stages))
        if cfg.block_n > 16:  # "needs too much shared memory"
            raise triton.runtime.errors.OutOfResources(2, 1, "shared memory")
        return real_launch(*args)

    monkeypatch.setattr(grouped, "_launch", small_gpu)
    got = grouped_sparse_mla_attention_triton(
        query.to(DEVICE),
        kv_cache.to(DEVICE),
        indices.to(DEVICE),
        scale,
        32,
        GroupedMLAConfig(block_n=32, num_stages=2),
    ).cpu()
    assert tried == [(32, 2), (32, 1), (16, 2)]
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_grouped_sparse_mla_mixed_rows_holes_and_empty_tokens():
    """Within one group: two tokens share a row, one has its own scattered row with
    holes, one has no valid index (zeros), and the last group is partial."""
    gen = torch.Generator().manual_seed(11)
    query = torch.randn(6, 4, 24, generator=gen)
    kv_cache = torch.randn(5, 4, 24, generator=gen)
    indices = torch.full((6, 32), -1, dtype=torch.int32)
    shared = torch.randperm(20, generator=gen)[:17].to(torch.int32)
    indices[0, :17] = indices[1, :17] = shared
    indices[2, [0, 5, 19, 31]] = torch.tensor([3, 7, 19, 0], dtype=torch.int32)
    indices[4, 3:9] = torch.arange(6, dtype=torch.int32)
    indices[5] = indices[4]
    want = ref.sparse_mla_attention_ref(query.double(), kv_cache.double(), indices, 0.3, 16)
    for config in (
        GroupedMLAConfig(group=4, block_n=16),
        GroupedMLAConfig(group=2, block_n=16, num_splits=2),
        GroupedMLAConfig(group=4, block_n=16, scan_block=8),
    ):
        got = grouped_sparse_mla_attention_triton(
            query.to(DEVICE), kv_cache.to(DEVICE), indices.to(DEVICE), 0.3, 16, config
        ).cpu()
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
        assert (got[3] == 0).all()


def _poison_unlisted_rows(kv_cache, indices):
    """NaN in every cache row no index lists: a kernel (or reference) that lets a row it
    was not asked for reach the output, even times a zero probability, returns NaN."""
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    listed = torch.zeros(flat.shape[0], dtype=torch.bool)
    listed[indices[indices >= 0].long()] = True
    flat[~listed] = float("nan")
    return kv_cache


@pytest.mark.parametrize("noncausal", [True, False])
@pytest.mark.parametrize(
    "config", [GroupedMLAConfig(block_n=16), GroupedMLAConfig(group=2, block_n=16, num_splits=3)]
)
def test_sparse_mla_ignores_unlisted_cache_rows(noncausal, config):
    """Cache rows outside the indices hold NaN (a block's rows past the window, rows
    before it, other requests' blocks): the reference, the grouped kernel and the
    per-token kernel never read them into the output."""
    from dspark_compile.kernels.sparse_mla_triton import sparse_mla_attention_triton

    query, kv_cache, indices = _mla_case(
        [90, 37, 5, 0, 61], [8, 8, 4, 0, 8], 16, 40, 3, 32, 16, noncausal, seed=209
    )
    clean = ref.sparse_mla_attention_ref(query.double(), kv_cache.double(), indices, 0.2, 32)
    kv_cache = _poison_unlisted_rows(kv_cache, indices)
    # slot 0 unlisted and rows with -1 holes: a gather that reads slot 0 for a hole sees NaN
    assert torch.isnan(kv_cache.reshape(-1, 48)[0]).all() and (indices < 0).any()
    want = ref.sparse_mla_attention_ref(query.double(), kv_cache.double(), indices, 0.2, 32)
    assert torch.equal(want, clean)
    grouped = grouped_sparse_mla_attention_triton(
        query.to(DEVICE), kv_cache.to(DEVICE), indices.to(DEVICE), 0.2, 32, config
    ).cpu()
    per_token = sparse_mla_attention_triton(
        query.to(DEVICE), kv_cache.to(DEVICE), indices.to(DEVICE), 0.2, 32
    ).cpu()
    for got in (grouped, per_token):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_grouped_config_is_validated():
    for bad, message in (
        (dict(scan_block=100), "scan_block=100 is invalid: expected a power"),
        (dict(group=3), "group=3 is invalid"),
        (dict(num_stages=0), "num_stages=0"),
        (dict(num_splits=0), "num_splits=0"),
    ):
        with pytest.raises(ValueError, match=message):
            GroupedMLAConfig(**bad)


@pytest.mark.parametrize("noncausal", [True, False])
def test_grouped_sparse_mla_trailing_padding_changes_nothing(noncausal):
    """Rows padded with three more tiles of ``-1`` (rows end at several columns, mid-tile
    and on a tile edge): the result is the reference's, with or without column splits,
    and without splits bit for bit the unpadded launch's."""
    query, kv_cache, indices = _mla_case(
        [150, 40, 64, 3], [8, 8, 8, 3], 16, 48, 4, 32, 16, noncausal, seed=43
    )
    padded = torch.cat(
        [indices, torch.full((indices.shape[0], 3 * 16 + 5), -1, dtype=torch.int32)], dim=1
    )
    want = ref.sparse_mla_attention_ref(query.double(), kv_cache.double(), padded, 0.2, 32)
    args = (query.to(DEVICE), kv_cache.to(DEVICE))
    for config in (
        GroupedMLAConfig(block_n=16, num_splits=1),
        GroupedMLAConfig(block_n=16, num_splits=3),
    ):
        got = grouped_sparse_mla_attention_triton(*args, padded.to(DEVICE), 0.2, 32, config).cpu()
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    plain = grouped_sparse_mla_attention_triton(
        *args, indices.to(DEVICE), 0.2, 32, GroupedMLAConfig(block_n=16, num_splits=1)
    )
    unsplit = grouped_sparse_mla_attention_triton(
        *args, padded.to(DEVICE), 0.2, 32, GroupedMLAConfig(block_n=16, num_splits=1)
    )
    assert torch.equal(unsplit, plain)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="bf16 Triton path needs a GPU (the interpreter mishandles bf16)",
)
def test_grouped_sparse_mla_bf16():
    query, kv_cache, indices = _mla_case(
        [90, 37], [8, 8], 16, 64, 16, 64, 32, True, seed=5, dtype=torch.bfloat16
    )
    scale = 96**-0.5
    want = ref.sparse_mla_attention_ref(query.float(), kv_cache.float(), indices, scale, 64)
    got = grouped_sparse_mla_attention_triton(
        query.to(DEVICE),
        kv_cache.to(DEVICE),
        indices.to(DEVICE),
        scale,
        64,
        GroupedMLAConfig(block_n=32),
    ).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_mla_cache_write_triton_matches_reference(slot_dtype):
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(4, 8, 40, generator=gen)
    kv = torch.randn(6, 40, generator=gen)
    slots = torch.tensor([31, -1, 0, 9, -5, 17], dtype=slot_dtype)
    want = cache.clone()
    ref.mla_cache_write_ref(kv, want, slots)
    got = cache.to(DEVICE)
    mla_cache_write_triton(kv.to(DEVICE), got, slots.to(DEVICE))
    assert torch.equal(got.cpu(), want)
    assert torch.equal(got.cpu()[0, 1], cache[0, 1])  # slot 1 untouched
    half = cache.to(torch.float16).to(DEVICE)
    mla_cache_write_triton(kv.to(DEVICE), half, slots.to(DEVICE))  # casts to the cache dtype
    assert torch.equal(half.cpu()[3, 7], kv[0].to(torch.float16))


def test_mla_cache_write_triton_rejects_bad_shapes():
    with pytest.raises(ValueError, match="slot_mapping has shape \\(2,\\)"):
        mla_cache_write_triton(torch.randn(3, 8), torch.randn(2, 4, 8), torch.zeros(2))
    with pytest.raises(ValueError, match="expected \\[T, D\\] rows"):
        mla_cache_write_triton(torch.randn(3, 6), torch.randn(2, 4, 8), torch.zeros(3))


def _markov_case(num_reqs, num_steps, vocab, rank, dtype, seed):
    torch.manual_seed(seed)
    head = DSparkMarkovHead(vocab, rank)
    with torch.no_grad():
        head.embed.weight.mul_(2.0)
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(num_reqs, num_steps, vocab, generator=gen).to(dtype)
    anchors = torch.randint(0, vocab, (num_reqs,), generator=gen)
    return head.to(dtype).to(DEVICE), base.to(DEVICE), anchors.to(DEVICE)


# vocab 5000 is not a multiple of the kernel's 4096-token tile
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0, "mixed"])
def test_fused_markov_sampling_is_bit_identical(dtype, temperature):
    head, base, anchors = _markov_case(6, 4, 5000, 8, dtype, seed=1)
    seeds = torch.tensor([0, 1, 2**40 + 5, -7, 3, 9], device=DEVICE)
    positions = torch.tensor([0, 5, 100, 2**33, 7, 1], device=DEVICE)
    if temperature == "mixed":
        temperature = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0, 0.7], device=DEVICE)
    with torch.no_grad():
        want = sample_sequential(base, anchors, head, temperature, seeds, positions)
        got = sample_sequential_triton(base, anchors, head, temperature, seeds, positions)
    assert got.dtype == torch.int64 and got.shape == (6, 4)
    assert torch.equal(got, want)


def test_fused_markov_sampling_ties_pick_the_first_index_and_signs_order():
    """Equal maxima (also +0.0 vs -0.0) pick the lowest token, as torch.argmax does;
    all-negative rows order by value."""
    vocab = 4200
    head = DSparkMarkovHead(vocab, 2)
    with torch.no_grad():
        head.bias.weight.zero_()  # bias exactly 0: logits == base
    base = -torch.rand(3, 1, vocab, generator=torch.Generator().manual_seed(2)) - 1.0
    base[0, 0, [4100, 17, 600]] = 5.0  # a three-way tie across tiles
    base[1, 0, 4099] = 0.0
    base[1, 0, 4098] = -0.0
    base[2, 0, 4199] = -0.5  # the largest of negatives, in the last tile
    with torch.no_grad():
        want = sample_sequential(base, torch.zeros(3, dtype=torch.int64), head, 0.0, torch.zeros(3))
        got = sample_sequential_triton(
            base.to(DEVICE),
            torch.zeros(3, dtype=torch.int64, device=DEVICE),
            head.to(DEVICE),
            0.0,
            torch.zeros(3, device=DEVICE),
        )
    assert want[:, 0].tolist() == [17, 4098, 4199]
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize(
    "block_v,num_warps,max_candidates,blocks_per_program,num_stages",
    [
        (128, 1, 8, 1, 3),
        (1024, 4, 0, 1, 1),
        (8192, 16, 1, 1, 2),
        (2048, 8, 3, 1, 3),
        (128, 4, 8, 7, 4),
        (1024, 4, 1, 3, 1),
        (512, 2, 0, 16, 5),
        (256, 2, 8, 5, 2),
    ],
)
def test_fused_markov_launch_knobs_do_not_change_tokens(
    block_v, num_warps, max_candidates, blocks_per_program, num_stages
):
    """Blocks of 128 to 8192 tokens, 1 to 16 of them per program (40 programs per row
    down to one; a program's last block partly past the vocabulary): the row's last
    program writes the token, whichever that is; 0 to 8 filter candidates; 1 to 5 blocks
    in flight."""
    head, base, anchors = _markov_case(5, 3, 5000, 8, torch.float32, seed=4)
    seeds = torch.tensor([3, 1, 2**40 + 5, -7, 11], device=DEVICE)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0], device=DEVICE)
    with torch.no_grad():
        want = sample_sequential(base, anchors, head, temperature, seeds)
        got = sample_sequential_triton(
            base,
            anchors,
            head,
            temperature,
            seeds,
            block_v=block_v,
            num_warps=num_warps,
            max_candidates=max_candidates,
            blocks_per_program=blocks_per_program,
            num_stages=num_stages,
        )
    assert torch.equal(got, want)


def test_fused_markov_sampling_validates_and_handles_empty():
    head, base, anchors = _markov_case(2, 3, 64, 4, torch.float32, seed=3)
    for knobs, message in (
        (dict(block_v=100), "block_v=100 is invalid: expected a power"),
        (dict(block_v=64), "block_v=64 is invalid"),
        (dict(num_warps=3), "num_warps=3 is invalid: expected 1, 2, 4"),
        (dict(max_candidates=-1), "max_candidates=-1 is invalid: expected an int >= 0"),
        (dict(max_candidates=2.0), "max_candidates=2.0 is invalid"),
        (dict(blocks_per_program=0), "blocks_per_program=0 is invalid: expected an int >= 1"),
        (dict(num_stages=0), "num_stages=0 is invalid: expected an int >= 1"),
        (dict(num_stages=True), "num_stages=True is invalid"),
    ):
        with pytest.raises(ValueError, match=message):
            sample_sequential_triton(
                base, anchors, head, 0.0, torch.zeros(2, device=DEVICE), **knobs
            )
    with pytest.raises(ValueError, match="anchor_tokens has shape"):
        sample_sequential_triton(base, anchors[:1], head, 0.0, torch.zeros(2, device=DEVICE))
    empty = sample_sequential_triton(base[:, :0], anchors, head, 1.0, torch.zeros(2, device=DEVICE))
    assert empty.shape == (2, 0)


def test_noise_upper_bound_holds_and_is_tight_on_every_input():
    """The sampled-row filter is exact only while ``g_upper`` stays above the exact
    noise to NOISE_SHORTFALL_LIMIT, and it filters only while ``g_upper`` is close
    where winners come from: both checked over all 2**23 noise inputs, as compiled
    for this device (libdevice logf on CUDA)."""
    shortfall, tail_excess = markov_triton.gumbel_upper_error(DEVICE, tail=4.0)
    assert shortfall <= markov_triton.NOISE_SHORTFALL_LIMIT, shortfall
    assert 0.0 < tail_excess < 0.07, tail_excess


def _equal_noise_pair(seed, vocab, block):
    """The first position >= 0 whose noise is equal (a 23-bit collision) for two tokens of
    one block: (position, (lower token, higher token))."""
    from dspark_compile.kernels.markov_sampling import gumbel_noise

    for position in range(100):
        noise = gumbel_noise(torch.tensor([seed]), torch.tensor([position]), vocab)[0]
        order = torch.argsort(noise, stable=True)
        same = (noise[order[1:]] == noise[order[:-1]]) & (order[1:] // block == order[:-1] // block)
        if same.any():
            pair = order[:-1][same][0].item(), order[1:][same][0].item()
            return position, (min(pair), max(pair))
    raise AssertionError("no colliding noise in 100 positions")


def _filter_rows(vocab, block, temperature):
    """Rows whose winner sits where the sampled-row filter is tested: (base [6, 1, V],
    seeds, positions, tie). Row 0 random; 1: six tokens within ~1e-5 of each other on
    top, five in one block and two in one lane (6 and block + 6: a program's lane keeps
    only its best two); 2: an exact tie on top (equal noise, equal logit: ``tie[0]``
    wins); 3: a first block with no finite logit and half the rest -inf; 4: three
    logits whose quotient by T overflows to inf (the first, 5, wins); 5: every logit
    -inf (token 0)."""
    from dspark_compile.kernels.markov_sampling import gumbel_noise

    gen = torch.Generator().manual_seed(5)
    base = torch.randn(6, 1, vocab, generator=gen) * 3
    seeds = torch.tensor([11, 12, 13, 14, 15, 16])
    positions = torch.tensor([77, 5, 0, 9, 2, 4])
    noise = gumbel_noise(seeds[1:2], positions[1:2], vocab)[0]
    picked = torch.tensor([block + 6, block + 7, block + 300, 2 * block - 1, block, 6])
    base[1, 0, picked] = (
        (30.0 - noise[picked].double() + torch.arange(6) * 2e-6) * temperature
    ).float()
    positions[2], tie = _equal_noise_pair(13, vocab, block)
    base[2, 0, list(tie)] = 40.0
    base[3, 0, torch.randperm(vocab, generator=gen)[: vocab // 2]] = float("-inf")
    base[3, 0, :block] = float("-inf")
    base[4, 0, [block + 5, 5, vocab - 1]] = 3.3e38
    base[5] = float("-inf")
    return base, seeds, positions, tie


def _sample_without_bias(base, temperature, seeds, positions, **knobs):
    """(``sample_sequential``, ``sample_sequential_triton(**knobs)``) tokens of ``base``
    [R, N, V] (CPU) through a Markov head whose bias is exactly 0 (logits == base)."""
    head = DSparkMarkovHead(base.shape[-1], 2)
    with torch.no_grad():
        head.bias.weight.zero_()
        args = (
            base.to(DEVICE),
            torch.zeros(base.shape[0], dtype=torch.int64, device=DEVICE),
            head.to(DEVICE),
            temperature,
            seeds.to(DEVICE),
            positions.to(DEVICE),
        )
        return sample_sequential(*args), sample_sequential_triton(*args, **knobs)


_SLACK = markov_triton.UPPER_ABS_SLACK


@pytest.mark.parametrize("wobble", [(0.0, 0.0), (0.9 * _SLACK, 0.9 * _SLACK), (0.9 * _SLACK, 1e4)])
@pytest.mark.parametrize("max_candidates,blocks_per_program", [(8, 1), (2, 3), (0, 2)])
def test_sampled_row_filter_gives_the_exact_tokens(wobble, max_candidates, blocks_per_program):
    """Whatever upper bound the filter gets within its slack (wobble: each token's bound
    pushed down by 0.9 x the absolute slack, or up by 0.9 x it or by 1e4, which any
    bound may be), the tokens are the reference's, bit for bit, on rows built to stress
    it (``_filter_rows``); blocks with several candidates take them one at a time (8) or
    compute every token's exact value (2, 0)."""
    vocab, block, temperature = 3000, 1024, 0.37
    base, seeds, positions, tie = _filter_rows(vocab, block, temperature)
    want, got = _sample_without_bias(
        base,
        temperature,
        seeds,
        positions,
        block_v=block,
        max_candidates=max_candidates,
        blocks_per_program=blocks_per_program,
        _bound_wobble=wobble,
    )
    assert want[2, 0].item() == tie[0] and want[4, 0].item() == 5 and want[5, 0].item() == 0
    assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("push_up", [0.5, 1.0])
def test_a_lanes_second_best_bound_can_still_win(push_up):
    """Two tokens one block apart (one lane of a program) are within 2e-5 of each other on
    top; the winner's bound is pushed down by 0.9 x the slack and the loser's up by
    ``push_up``: the lane's best ``upper`` is then not the row's token, and the kernel
    must see that its second best is a candidate too."""
    from dspark_compile.kernels.markov_sampling import _mix32, gumbel_noise

    vocab, block, temperature = 3000, 1024, 0.37
    seeds, positions = torch.tensor([21]), torch.tensor([3])
    lanes = torch.arange(block)
    # the wobble's direction of a token, as the kernel computes it (0: pushed down)
    up = [(_mix32(torch.bitwise_xor(t, 0x9E3779B9)) & 1) for t in (lanes, lanes + block)]
    lane = int(torch.nonzero(up[0] != up[1])[0])
    pushed_down = lane if bool(up[0][lane] == 0) else lane + block
    loser = lane + block if pushed_down == lane else lane
    noise = gumbel_noise(seeds, positions, vocab)[0].double()
    base = torch.randn(1, 1, vocab, generator=torch.Generator().manual_seed(8))
    for token, margin in ((pushed_down, 2e-5), (loser, 0.0)):  # 5 ulps of 60
        base[0, 0, token] = ((60.0 - noise[token] + margin) * temperature).float()
    want, got = _sample_without_bias(
        base,
        temperature,
        seeds,
        positions,
        block_v=block,
        max_candidates=8,
        blocks_per_program=3,
        _bound_wobble=(0.9 * _SLACK, push_up),
    )
    assert want[0, 0].item() == pushed_down
    assert torch.equal(got, want), (got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_compiled_dspark_draft_step_replays_as_cuda_graph_with_changing_seq_lens():
    from dspark_compile.models.dspark_draft import DSparkDraftConfig
    from dspark_compile.tools.dspark_graph_check import check_draft_step_graph

    cfg = DSparkDraftConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        kv_lora_rank=32,
        rope_dim=16,
        intermediate_size=128,
        vocab_size=64,
        markov_rank=4,
        sliding_window=48,
    )
    errors = check_draft_step_graph(
        cfg,
        window=40,
        block_size=16,
        step_seq_lens=[[200, 70, 9], [216, 78, 17], [205, 80, 30]],
        q_len=8,
    )
    assert max(errors) < 1e-3, errors
