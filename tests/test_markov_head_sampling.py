"""The Markov sampler with the head's bias computed in the kernel
(``kernels/markov_head_sampling_triton.py``) against ``sample_sequential``: Triton
interpreter on CPU, compiled on CUDA.

On CPU the heads hold dyadic weights (multiples of 1/64 and 1/128, rank <= 64), so
every sum of products (19 significant bits at most) is exact in fp32 whatever the
order: the module's bias and the kernel's then agree bit for bit by construction, and
the tests check the rest of the kernel.
On CUDA the heads are randomly initialised as usual and the bias check is the real one.
"""

import pytest
import torch
from torch import nn

from dspark_compile.kernels import markov_head_sampling_triton as head_triton
from dspark_compile.kernels.markov_head_sampling_triton import (
    markov_head_bias_triton,
    sample_sequential_head_triton,
)
from dspark_compile.models import DSparkMarkovHead, gumbel_noise, sample_sequential

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _head(vocab, rank, dtype, seed):
    torch.manual_seed(seed)
    head = DSparkMarkovHead(vocab, rank)
    if DEVICE == "cpu":
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            head.embed.weight.copy_(torch.randint(-63, 64, (vocab, rank), generator=gen) / 64)
            head.bias.weight.copy_(torch.randint(-127, 128, (vocab, rank), generator=gen) / 128)
    return head.to(dtype).to(DEVICE)


def _case(num_reqs, num_steps, vocab, rank, dtype, seed, base_dtype=None):
    head = _head(vocab, rank, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    base = (torch.randn(num_reqs, num_steps, vocab, generator=gen) * 2).to(base_dtype or dtype)
    anchors = torch.randint(0, vocab, (num_reqs,), generator=gen)
    seeds = torch.randint(-(2**62), 2**62, (num_reqs,), generator=gen)
    positions = torch.randint(0, 2**40, (num_reqs,), generator=gen)
    temps = torch.rand(num_reqs, generator=gen) * 1.5 + 0.25
    temps[::3] = 0.0
    return (
        head,
        base.to(DEVICE),
        anchors.to(DEVICE),
        seeds.to(DEVICE),
        positions.to(DEVICE),
        temps.to(DEVICE),
    )


def _both(base, anchors, head, temperature, seeds, positions, **knobs):
    with torch.no_grad():
        want = sample_sequential(base, anchors, head, temperature, seeds, positions)
        got = sample_sequential_head_triton(
            base, anchors, head, temperature, seeds, positions, **knobs
        )
    return got, want


# (R, N, V, rank, base dtype): V not a multiple of the 32-token tile; a rank that is not
# a power of two, one below the tensor cores' 16; 70 rows (two row blocks of 64); one row
@pytest.mark.parametrize(
    "num_reqs,num_steps,vocab,rank,base_dtype",
    [(6, 3, 700, 24, None), (1, 2, 100, 8, torch.float32), (70, 2, 150, 16, None)],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [0.0, 1.0, "mixed"])
def test_head_in_kernel_tokens_are_bit_identical(
    num_reqs, num_steps, vocab, rank, base_dtype, dtype, temperature
):
    head, base, anchors, seeds, positions, temps = _case(
        num_reqs, num_steps, vocab, rank, dtype, 5, base_dtype
    )
    temperature = temps if temperature == "mixed" else temperature
    got, want = _both(base, anchors, head, temperature, seeds, positions)
    assert got.dtype == torch.int64 and got.shape == (num_reqs, num_steps)
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    "block_v,tiles_per_program,num_warps,num_stages,filter_upper",
    [
        (16, 1, 4, 1, True),
        (32, 3, 8, 2, True),
        (64, 16, 4, 4, True),
        (128, 2, 8, 3, False),
        (32, 40, 4, 3, True),
        (16, 5, 4, 2, False),
    ],
)
def test_head_in_kernel_launch_knobs_do_not_change_tokens(
    block_v, tiles_per_program, num_warps, num_stages, filter_upper
):
    """16- to 128-token tiles, 1 to 40 per program (44 programs per row block down to
    one; a program's last tile partly past the vocabulary), with and without the
    filter."""
    head, base, anchors, seeds, positions, temps = _case(5, 3, 700, 16, torch.bfloat16, 7)
    got, want = _both(
        base,
        anchors,
        head,
        temps,
        seeds,
        positions,
        block_v=block_v,
        tiles_per_program=tiles_per_program,
        num_warps=num_warps,
        num_stages=num_stages,
        filter_upper=filter_upper,
    )
    assert torch.equal(got, want)


def test_filter_gives_the_same_tokens_anywhere_within_its_slack():
    """Each ``fast`` pushed down or up by 0.9x its absolute slack: same tokens. Pushed
    up by any amount: same tokens (more candidates and rescans). Half of them pushed down
    by 1.0, far beyond the slack: some differ, so the hook (and this test) has teeth."""
    head, base, anchors, seeds, positions, _ = _case(8, 4, 600, 16, torch.bfloat16, 11)
    want = _both(base, anchors, head, 1.0, seeds, positions)[1]
    slack = 2 * head_triton.NOISE_ERROR_LIMIT
    for wobble in ((0.9 * slack, 0.9 * slack), (0.0, 3.0)):
        got = _both(base, anchors, head, 1.0, seeds, positions, _fast_wobble=wobble)[0]
        assert torch.equal(got, want), wobble
    far = _both(base, anchors, head, 1.0, seeds, positions, _fast_wobble=(1.0, 0.0))[0]
    assert not torch.equal(far, want)


def _near_tie_case(pairs, vocab=256, rank=16):
    """Step 0 of row r has tokens ``pairs[r]`` at ``8 - g`` (T = 1), within float
    roundings of each other; every other token is far below."""
    head = _head(vocab, rank, torch.bfloat16, 13)
    rows = len(pairs)
    anchors = torch.arange(rows, device=DEVICE) * 7
    seeds = torch.arange(rows, device=DEVICE) * 1000 + 3
    positions = torch.zeros(rows, dtype=torch.int64, device=DEVICE)
    with torch.no_grad():
        bias = head(anchors).float()
    noise = gumbel_noise(seeds, positions, vocab)
    base = -20.0 - torch.rand(rows, 2, vocab, generator=torch.Generator().manual_seed(3))
    base = base.to(DEVICE)
    for row, tokens in enumerate(pairs):
        for token in tokens:
            base[row, 0, token] = 8.0 - noise[row, token] - bias[row, token]
    return head, base, anchors, seeds, positions


def test_near_ties_in_other_lanes_and_in_one_lane_are_resolved_exactly():
    """Row 0: two near-tied tokens in different lanes (both get ``exact``). Row 1: two
    in one lane (tokens 32 apart with 32-token tiles): the row is rescanned. Row 2:
    three, across lanes and in one."""
    head, base, anchors, seeds, positions = _near_tie_case([(40, 41), (70, 102), (5, 37, 200)])
    rescans = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    got, want = _both(
        base, anchors, head, 1.0, seeds, positions, block_v=32, tiles_per_program=8, rescans=rescans
    )
    assert torch.equal(got, want)
    assert int(rescans) >= 2
    assert want[0, 0].item() in (40, 41) and want[1, 0].item() in (70, 102)


def test_greedy_ties_pick_the_first_index_and_minus_inf_rows_pick_token_zero():
    vocab = 300
    head = _head(vocab, 16, torch.bfloat16, 17)
    with torch.no_grad():
        head.bias.weight.zero_()  # bias exactly 0: logits == base
    base = -torch.rand(4, 1, vocab, generator=torch.Generator().manual_seed(2)) - 1.0
    base[0, 0, [290, 17, 130]] = 5.0  # a three-way tie across programs
    base[1, 0, 201] = 0.0
    base[1, 0, 200] = -0.0
    base[2, 0, 299] = -0.5  # the largest, in the last partial tile
    base[3] = float("-inf")
    anchors = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    seeds = torch.arange(4, device=DEVICE)
    for temperature in (0.0, 1.0):
        got, want = _both(
            base.to(DEVICE),
            anchors,
            head,
            temperature,
            seeds,
            None,
            block_v=32,
            tiles_per_program=2,
        )
        assert torch.equal(got, want)
    assert got[3, 0].item() == 0
    greedy = _both(base.to(DEVICE), anchors, head, 0.0, seeds, None)[1]
    assert greedy[:, 0].tolist() == [17, 200, 299, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bias_rounds_to_the_head_dtype_before_the_argmax(dtype):
    """Token 5's bias sums to 1, token 9's to 1 + 2**-13: in the head's dtype both are
    1, a tie that the lower token wins. A kernel that kept the fp32 sums would pick 9."""
    vocab, rank = 64, 16
    head = DSparkMarkovHead(vocab, rank)
    with torch.no_grad():
        head.embed.weight.zero_()
        head.embed.weight[3, :2] = 1.0
        head.bias.weight.zero_()
        head.bias.weight[:, 0] = -1.0
        head.bias.weight[5, 0] = 1.0
        head.bias.weight[9, 0] = 1.0
        head.bias.weight[9, 1] = 2.0**-13
    head = head.to(dtype).to(DEVICE)
    base = torch.zeros(1, 1, vocab, device=DEVICE)
    anchors = torch.tensor([3], device=DEVICE)
    got, want = _both(base, anchors, head, 0.0, torch.zeros(1, device=DEVICE), None)
    assert want.tolist() == [[5]] and torch.equal(got, want)


def test_in_kernel_bias_equals_the_module():
    """The premise of bit identity. On CUDA the head is randomly initialised, so this
    compares the tensor-core sums with the GEMM the module calls (cuBLAS)."""
    for dtype in (torch.bfloat16, torch.float16):
        head = _head(1000, 64, dtype, 19)
        prev = torch.randint(0, 1000, (37,), device=DEVICE)
        with torch.no_grad():
            assert torch.equal(markov_head_bias_triton(head, prev), head(prev))
            assert markov_head_bias_triton(head, prev[:0]).shape == (0, 1000)


def test_noise_fast_value_is_within_its_limit_on_every_input():
    """The filter is exact only while ``g_fast`` stays within NOISE_ERROR_LIMIT of the
    exact noise: checked over all 2**23 noise inputs, as compiled for this device."""
    assert head_triton.gumbel_fast_error(DEVICE) < head_triton.NOISE_ERROR_LIMIT


class _FixedBias(nn.Module):
    def forward(self, prev):
        return torch.zeros(prev.shape[0], 64, device=prev.device)


def test_head_in_kernel_validates_and_handles_empty():
    head, base, anchors, seeds, positions, _ = _case(2, 3, 64, 16, torch.bfloat16, 3)

    def call(markov_head=head, **knobs):
        return sample_sequential_head_triton(base, anchors, markov_head, 1.0, seeds, **knobs)

    for knobs, message in (
        (dict(block_v=8), "block_v=8 is invalid: expected a power of two"),
        (dict(block_v=24), "block_v=24 is invalid"),
        (dict(block_v=True), "block_v=True is invalid"),
        (dict(tiles_per_program=0), "tiles_per_program=0 is invalid: expected an int >= 1"),
        (dict(num_warps=2), "num_warps=2 is invalid: expected 4 or 8"),
        (dict(num_stages=0), "num_stages=0 is invalid"),
        (dict(filter_upper=1), "filter_upper=1 is invalid: expected True"),
        (dict(rescans=torch.zeros(1, dtype=torch.int64, device=DEVICE)), "rescans is torch.int64"),
    ):
        with pytest.raises(ValueError, match=message):
            call(**knobs)
    with pytest.raises(
        ValueError, match="markov_head is a _FixedBias: the in-kernel head needs a DSparkMarkovHead"
    ):
        call(_FixedBias())

    class Doubled(DSparkMarkovHead):
        def forward(self, prev_tokens):
            return 2 * super().forward(prev_tokens)

    with pytest.raises(ValueError, match="has its own forward"):
        call(Doubled(64, 16).to(torch.bfloat16).to(DEVICE))
    with pytest.raises(ValueError, match="both float16 or both bfloat16"):
        call(_head(64, 16, torch.float32, 3))
    hooked = _head(64, 16, torch.bfloat16, 3)
    hooked.bias.register_forward_hook(lambda module, args, out: out * 2)
    with pytest.raises(ValueError, match="forward hooks"):
        call(hooked)
    renormed = _head(64, 16, torch.bfloat16, 3)
    renormed.embed.max_norm = 1.0
    with pytest.raises(ValueError, match="max_norm=1.0 is invalid here: expected None"):
        call(renormed)
    biased = _head(64, 16, torch.bfloat16, 3)
    biased.bias = nn.Linear(16, 64).to(torch.bfloat16).to(DEVICE)
    with pytest.raises(ValueError, match="additive bias"):
        call(biased)
    with pytest.raises(
        ValueError,
        match="embed has shape \\(100, 16\\): expected \\[64, r\\], "
        "64 being base_logits' vocabulary",
    ):
        call(_head(100, 16, torch.bfloat16, 3))
    with pytest.raises(ValueError, match="anchor_tokens has shape"):
        sample_sequential_head_triton(base, anchors[:1], head, 0.0, seeds)
    assert sample_sequential_head_triton(base[:, :0], anchors, head, 1.0, seeds).shape == (2, 0)
    assert sample_sequential_head_triton(base[:0], anchors[:0], head, 1.0, seeds[:0]).shape == (
        0,
        3,
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_head_in_kernel_block_replays_as_one_cuda_graph():
    head, base, anchors, seeds, positions, temps = _case(8, 4, 5000, 64, torch.bfloat16, 23)
    with torch.no_grad():
        sample_sequential_head_triton(base, anchors, head, temps, seeds, positions)  # compile
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = sample_sequential_head_triton(base, anchors, head, temps, seeds, positions)
        for trial in range(3):
            base.copy_(torch.randn_like(base))
            seeds.add_(1)
            graph.replay()
            want = sample_sequential(base, anchors, head, temps, seeds, positions)
            assert torch.equal(out, want), trial
