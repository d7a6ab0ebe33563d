"""Markov head and sequential sampling: greedy == a Python loop, Gumbel-max sampling
follows softmax(base + bias), noise is reproducible from (seed, position)."""

import pytest
import torch

from dspark_compile.models import DSparkMarkovHead, gumbel_noise, sample_sequential
from dspark_compile.models.markov_sampling import block_sample_indices


def _head(vocab=16, rank=4, seed=0):
    torch.manual_seed(seed)
    head = DSparkMarkovHead(vocab, rank)
    with torch.no_grad():
        head.embed.weight.mul_(2.0)  # a Markov bias large enough to matter
    return head


def test_greedy_equals_step_by_step_python_loop():
    head = _head()
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(5, 6, 16, generator=gen)
    anchors = torch.randint(0, 16, (5,), generator=gen)
    with torch.no_grad():
        got = sample_sequential(base, anchors, head, 0.0, torch.arange(5))
        for r in range(5):
            prev = int(anchors[r])
            for i in range(6):
                bias = head.bias.weight @ head.embed.weight[prev]
                want = int(torch.argmax(base[r, i] + bias))
                assert int(got[r, i]) == want
                prev = want
        # The Markov head matters: without it greedy decoding differs somewhere.
        assert not torch.equal(got, base.argmax(-1))


def test_same_seed_same_tokens_and_different_seeds_differ():
    head = _head()
    base = torch.randn(64, 4, 16, generator=torch.Generator().manual_seed(2))
    anchors = torch.zeros(64, dtype=torch.int64)
    seeds = torch.arange(64) * 7919
    with torch.no_grad():
        a = sample_sequential(base, anchors, head, 1.0, seeds)
        b = sample_sequential(base, anchors, head, 1.0, seeds.clone())
        c = sample_sequential(base, anchors, head, 1.0, seeds + 1)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_noise_is_a_function_of_seed_position_and_token():
    seeds = torch.tensor([3, 3, 4, 2**40 + 3])
    positions = torch.tensor([10, 11, 10, 10])
    noise = gumbel_noise(seeds, positions, 32)
    assert noise.shape == (4, 32) and torch.isfinite(noise).all()
    assert torch.equal(noise, gumbel_noise(seeds, positions, 32))
    for i in range(1, 4):  # another position, seed or high seed bits
        assert not torch.equal(noise[0], noise[i])
    # A verifier regenerates row 0 alone.
    assert torch.equal(gumbel_noise(seeds[:1], positions[:1], 32)[0], noise[0])


def test_sampling_distribution_matches_softmax_of_base_plus_bias():
    """Many seeds, one request each: step 0 and step 1 (given step 0) match
    softmax((base + bias(prev)) / T) in total variation."""
    vocab, num_seeds, temperature = 8, 20000, 0.7
    head = _head(vocab, 3, seed=4)
    gen = torch.Generator().manual_seed(5)
    base_row = torch.randn(2, vocab, generator=gen)
    base = base_row.expand(num_seeds, 2, vocab).contiguous()
    anchors = torch.full((num_seeds,), 3, dtype=torch.int64)
    with torch.no_grad():
        tokens = sample_sequential(
            base,
            anchors,
            head,
            temperature,
            torch.arange(num_seeds),
            positions=torch.full((num_seeds,), 1000),
        )
        want0 = torch.softmax((base_row[0] + head(torch.tensor([3]))[0]) / temperature, -1)
        got0 = torch.bincount(tokens[:, 0], minlength=vocab).double() / num_seeds
        assert 0.5 * (got0 - want0.double()).abs().sum() < 0.02
        first = int(torch.mode(tokens[:, 0]).values)
        rows = tokens[:, 0] == first
        want1 = torch.softmax((base_row[1] + head(torch.tensor([first]))[0]) / temperature, -1)
        got1 = torch.bincount(tokens[rows, 1], minlength=vocab).double() / int(rows.sum())
        assert 0.5 * (got1 - want1.double()).abs().sum() < 0.04


def test_per_row_temperature_mixes_greedy_and_sampled_rows():
    head = _head()
    base = torch.randn(6, 3, 16, generator=torch.Generator().manual_seed(6))
    anchors = torch.arange(6)
    temps = torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0, 1.0])
    with torch.no_grad():
        mixed = sample_sequential(base, anchors, head, temps, torch.arange(6))
        greedy = sample_sequential(base, anchors, head, 0.0, torch.arange(6))
        hot = sample_sequential(base, anchors, head, 1.0, torch.arange(6))
    assert torch.equal(mixed[temps == 0], greedy[temps == 0])
    assert torch.equal(mixed[1], hot[1]) and torch.equal(mixed[5], hot[5])


def test_bad_arguments_are_named():
    head = _head()
    base = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match="anchor_tokens has shape \\(3,\\): expected \\[2\\]"):
        sample_sequential(base, torch.zeros(3, dtype=torch.int64), head, 0.0, torch.zeros(2))
    with pytest.raises(ValueError, match="temperature=-1.0 is invalid"):
        sample_sequential(base, torch.zeros(2, dtype=torch.int64), head, -1.0, torch.zeros(2))
    with pytest.raises(ValueError, match="rank=0 is invalid"):
        DSparkMarkovHead(16, 0)


def test_block_sample_indices_pad_with_minus_one():
    locs = torch.tensor([0, 5, 8, 14], dtype=torch.int32)
    got = block_sample_indices(locs, num_steps=4, num_rows=5)
    want = torch.tensor(
        [[1, 2, 3, 4], [6, 7, -1, -1], [9, 10, 11, 12], [-1, -1, -1, -1], [-1, -1, -1, -1]]
    )
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="num_rows=2 is invalid"):
        block_sample_indices(locs, num_steps=4, num_rows=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_sampling_is_cuda_graph_capturable():
    head = _head().cuda()
    base = torch.randn(4, 5, 16, device="cuda")
    anchors = torch.arange(4, device="cuda")
    seeds = torch.arange(4, device="cuda")
    temps = torch.tensor([0.0, 1.0, 0.5, 1.0], device="cuda")
    with torch.no_grad():
        want = sample_sequential(base, anchors, head, temps, seeds)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            sample_sequential(base, anchors, head, temps, seeds)  # warm up
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = sample_sequential(base, anchors, head, temps, seeds)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_low_rank_factors_are_the_forward():
    head = DSparkMarkovHead(50, 6)
    prev = torch.randint(0, 50, (9,))
    embed, weight = head.low_rank_factors()
    assert not embed.requires_grad and not weight.requires_grad
    with torch.no_grad():
        assert torch.equal(torch.nn.functional.linear(embed[prev], weight), head(prev))
    head.embed.register_forward_pre_hook(lambda module, args: None)
    with pytest.raises(ValueError, match="forward hooks"):
        head.low_rank_factors()
