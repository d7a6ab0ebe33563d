"""``dspark.markov_head_sample`` (``ops/markov_sampling.py``) and the draft's ``propose`` on it.

The op is ``sample_sequential``'s loop with the head given by its factors: the CPU
reference shares the loop (tokens equal for any weights), the CUDA implementation runs
the fused head kernel for float16/bfloat16 factors (here under the Triton interpreter on
CPU tensors, with ``test_markov_head_sampling``'s dyadic heads so that its bias is exact).
It compiles as one opaque node, and ``propose`` keeps the tokens it had with the module.
"""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from dspark_compile.kernels import markov_head_sampling_triton as head_triton
from dspark_compile.kernels.markov_sampling import low_rank_bias
from dspark_compile.models import block_sample_indices, dspark_draft, sample_sequential
from dspark_compile.testing.dspark_case import make_dspark_case
from tests import test_markov_head_sampling as head_cases, test_markov_sampling as markov_cases

OP = torch.ops.dspark.markov_head_sample


def _inputs(dtype, seed=5, num_reqs=6, num_steps=3, vocab=40, rank=6):
    """``(head, base, anchors, seeds, positions, temps)`` on CPU: a randomly initialised head
    (``test_markov_sampling._head``, not dyadic) in ``dtype``, and ``test_markov_head_sampling
    ._case``'s logits (in ``dtype``), anchors, 62-bit seeds, positions and mixed temperatures
    (every third row greedy)."""
    _, *rest = head_cases._case(
        num_reqs, num_steps, vocab, rank, torch.float32, seed, base_dtype=dtype
    )
    return (markov_cases._head(vocab, rank, seed).to(dtype), *(t.cpu() for t in rest))


def _temperature(temperature, temps):
    """``(as sample_sequential takes it, as the op takes it: [R] float32)``."""
    if temperature == "mixed":
        return temps, temps
    return temperature, torch.full_like(temps, temperature)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0, "mixed"])
@pytest.mark.parametrize("with_positions", [True, False])
def test_op_equals_sample_sequential_on_cpu(dtype, temperature, with_positions):
    head, base, anchors, seeds, positions, temps = _inputs(dtype)
    positions = positions if with_positions else None
    as_float, as_tensor = _temperature(temperature, temps)
    embed, weight = head.low_rank_factors()
    with torch.no_grad():
        want = sample_sequential(base, anchors, head, as_float, seeds, positions)
    got = OP(base, anchors, embed, weight, as_tensor, seeds, positions)
    assert got.dtype == torch.int64 and got.shape == (6, 3)
    assert torch.equal(got, want)
    # the head and the noise matter: without the bias, or at another seed, tokens differ
    assert not torch.equal(got, OP(base, anchors, embed, weight * 0, as_tensor, seeds, positions))
    if temperature != 0.0:
        assert not torch.equal(
            got, OP(base, anchors, embed, weight, as_tensor, seeds + 1, positions)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_bias_is_the_module_forward_bit_for_bit(dtype):
    head = markov_cases._head(300, 24, seed=3).to(dtype)
    prev = torch.randint(0, 300, (50,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = head(prev)
    got = low_rank_bias(prev, *head.low_rank_factors())
    assert got.dtype == dtype and torch.equal(got, want)


def test_op_handles_empty_blocks():
    head, base, anchors, seeds, positions, temps = _inputs(torch.float32)
    factors = head.low_rank_factors()
    assert OP(base[:, :0], anchors, *factors, temps, seeds, positions).shape == (6, 0)
    assert OP(base[:0], anchors[:0], *factors, temps[:0], seeds[:0], None).shape == (0, 3)


def test_all_greedy_rows_skip_the_noise_on_cpu(monkeypatch):
    """A temperature tensor of zeros samples greedily without computing the noise, as
    ``sample_sequential`` does for a float 0 (on CPU, where reading it costs no sync)."""
    from dspark_compile.kernels import markov_sampling as reference

    head, base, anchors, seeds, positions, temps = _inputs(torch.float32)
    factors = head.low_rank_factors()
    with torch.no_grad():
        want = sample_sequential(base, anchors, head, 0.0, seeds, positions)

    def no_noise(*args):
        raise AssertionError("noise computed for greedy rows")

    monkeypatch.setattr(reference, "gumbel_noise", no_noise)
    assert torch.equal(OP(base, anchors, *factors, torch.zeros_like(temps), seeds, positions), want)
    with pytest.raises(AssertionError, match="noise computed"):
        OP(base, anchors, *factors, temps, seeds, positions)


def _draft(dtype):
    """(model, hidden, query_start_loc, anchors, seeds, positions) of
    ``make_dspark_case``: two requests and one CUDA-graph padding row."""
    model, batch, _, hidden = make_dspark_case([30, 9], [5, 5], seed=5)
    anchors = torch.tensor([3, 7, 0])
    return (
        model.to(dtype),
        hidden.to(dtype),
        batch.query_start_loc,
        anchors,
        torch.tensor([11, 2**40, 5]),
        torch.tensor([30, 9, 0]),
    )


def _propose_with_module(model, hidden, locs, anchors, num_steps, temperature, seeds, positions):
    """``propose`` as it was before the op: ``sample_sequential`` with the module."""
    index = block_sample_indices(locs, num_steps, anchors.shape[0])
    with torch.no_grad():
        base = model.lm_head(hidden[index.clamp(min=0)])
        tokens = sample_sequential(base, anchors, model.markov_head, temperature, seeds, positions)
    return torch.where(index >= 0, tokens, torch.full_like(tokens, -1))


def _no_module_sampler(*args, **kwargs):
    raise AssertionError("propose ran sample_sequential for a plain DSparkMarkovHead")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 0.8, "mixed"])
@pytest.mark.parametrize("with_positions", [True, False])
def test_propose_keeps_its_tokens_through_the_op(monkeypatch, dtype, temperature, with_positions):
    model, hidden, locs, anchors, seeds, positions = _draft(dtype)
    positions = positions if with_positions else None
    if temperature == "mixed":
        temperature = torch.tensor([0.0, 0.8, 1.0])
    want = _propose_with_module(model, hidden, locs, anchors, 4, temperature, seeds, positions)
    monkeypatch.setattr(dspark_draft, "sample_sequential", _no_module_sampler)
    got = model.propose(hidden, locs, anchors, 4, temperature, seeds, positions)  # grad mode
    assert torch.equal(got, want)
    assert (got[2] == -1).all() and (got[:2] >= 0).all()


class _Shifted(nn.Module):
    """A head of another class: ``DSparkMarkovHead``'s bias plus 40 on token 7."""

    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, prev):
        return self.head(prev) + 40.0 * (torch.arange(self.head.vocab_size) == 7)


def _shift_token_seven(module, args, out):
    return out + 40.0 * (torch.arange(out.shape[-1]) == 7)


@pytest.mark.parametrize("kind", ["forward_hook", "other_module"])
def test_propose_runs_other_heads_through_the_module(kind):
    """A head whose ``low_rank_factors()`` raises (a forward hook) or that has none: the
    module's bias, hook included (it moves tokens to 7), not the factors'."""
    model, hidden, locs, anchors, seeds, positions = _draft(torch.float32)
    plain = model.propose(hidden, locs, anchors, 4, 1.0, seeds, positions)
    if kind == "forward_hook":
        model.markov_head.bias.register_forward_hook(_shift_token_seven)
        with pytest.raises(ValueError, match="forward hooks"):
            model.markov_head.low_rank_factors()
    else:
        model.markov_head = _Shifted(model.markov_head)
    want = _propose_with_module(model, hidden, locs, anchors, 4, 1.0, seeds, positions)
    got = model.propose(hidden, locs, anchors, 4, 1.0, seeds, positions)
    assert torch.equal(got, want)
    assert not torch.equal(got, plain) and (got[:2] == 7).all()


def _graphs_of(fn):
    """``torch.compile(fn, fullgraph=True)`` (aot_eager) and the code of its graphs."""
    codes = []

    def backend(gm, example_inputs):
        codes.append(gm.code)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    return torch.compile(fn, fullgraph=True, backend=backend), codes


@pytest.mark.parametrize("backend", ["graph", "inductor"])
def test_op_compiles_without_graph_breaks_and_equals_eager(backend):
    head, base, anchors, seeds, positions, temps = _inputs(torch.bfloat16)
    embed, weight = head.low_rank_factors()

    def draft(base, temps, seeds):
        tokens = OP(base * 2, anchors, embed, weight, temps, seeds, positions)
        return torch.where(tokens % 2 == 0, tokens, -tokens)

    if backend == "graph":
        compiled, codes = _graphs_of(draft)
    else:
        compiled, codes = torch.compile(draft, fullgraph=True, backend="inductor"), None
    for trial in range(2):  # new inputs, no recompile needed
        got = compiled(base + trial, temps, seeds + trial)
        assert torch.equal(got, draft(base + trial, temps, seeds + trial))
    if codes is not None:
        assert len(codes) == 1 and "dspark.markov_head_sample" in codes[0]


@pytest.mark.parametrize("kind", ["plain", "forward_hook"])
def test_propose_compiles_without_graph_breaks_and_equals_eager(kind):
    model, hidden, locs, anchors, seeds, positions = _draft(torch.float32)
    if kind == "forward_hook":
        model.markov_head.bias.register_forward_hook(_shift_token_seven)
    compiled, codes = _graphs_of(model.propose)
    for temperature in (0.0, 1.0):
        want = model.propose(hidden, locs, anchors, 4, temperature, seeds, positions)
        assert torch.equal(compiled(hidden, locs, anchors, 4, temperature, seeds, positions), want)
    assert codes and ("dspark.markov_head_sample" in codes[0]) == (kind == "plain")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_positions", [True, False])
def test_opcheck(dtype, with_positions):
    head, base, anchors, seeds, positions, temps = _inputs(dtype, num_reqs=4, vocab=24)
    args = (
        base.requires_grad_(dtype == torch.float32),
        anchors,
        *head.low_rank_factors(),
        temps,
        seeds,
        positions if with_positions else None,
    )
    torch.library.opcheck(OP.default, args)


def _bad_inputs():
    """``(name, change to the valid arguments, message)``."""
    return [
        (
            "base_logits",
            lambda a: a.update(base_logits=a["base_logits"][0]),
            r"base_logits has shape \(3, 40\): expected \[R, N, V\]",
        ),
        (
            "anchor_tokens",
            lambda a: a.update(anchor_tokens=a["anchor_tokens"][:2]),
            r"anchor_tokens has shape \(2,\): expected \[6\]",
        ),
        (
            "seeds",
            lambda a: a.update(seeds=a["seeds"][:, None]),
            r"seeds has shape \(6, 1\): expected \[6\]",
        ),
        (
            "positions",
            lambda a: a.update(positions=a["positions"][:1]),
            r"positions has shape \(1,\): expected \[6\]",
        ),
        (
            "temperature",
            lambda a: a.update(temperature=a["temperature"][:3]),
            r"temperature has shape \(3,\): expected a float or \[6\]",
        ),
        (
            "embed",
            lambda a: a.update(embed=a["embed"][:30]),
            r"embed has shape \(30, 6\): expected \[40, r\], 40 being base_logits' vocabulary",
        ),
        (
            "weight",
            lambda a: a.update(weight=a["weight"][:, :4]),
            r"weight has shape \(40, 4\): expected embed's \(40, 6\)",
        ),
        (
            "weight dtype",
            lambda a: a.update(weight=a["weight"].bfloat16()),
            r"embed is torch.float32 and weight torch.bfloat16: expected one floating dtype",
        ),
        (
            "integer factors",
            lambda a: a.update(embed=a["embed"].long(), weight=a["weight"].long()),
            r"embed is torch.int64 and weight torch.int64: expected one floating dtype",
        ),
    ]


def _valid_args():
    head, base, anchors, seeds, positions, temps = _inputs(torch.float32)
    embed, weight = head.low_rank_factors()
    return dict(
        base_logits=base,
        anchor_tokens=anchors,
        embed=embed,
        weight=weight,
        temperature=temps,
        seeds=seeds,
        positions=positions,
    )


def _fake_call(**args):
    with FakeTensorMode() as mode:
        return OP(**{name: mode.from_tensor(value) for name, value in args.items()})


@pytest.mark.parametrize("impl", ["op", "fake", "cuda_impl"])
@pytest.mark.parametrize(
    "name,change,message", _bad_inputs(), ids=[case[0] for case in _bad_inputs()]
)
def test_bad_inputs_raise_value_error_naming_the_argument(impl, name, change, message):
    """The same checks in the reference (the op on CPU), the fake (what torch.compile
    runs) and the CUDA implementation (here on CPU tensors)."""
    call = {"op": OP, "fake": _fake_call, "cuda_impl": head_triton.markov_head_sample_triton}
    args = _valid_args()
    assert call[impl](**args).shape == (6, 3)
    change(args)
    with pytest.raises(ValueError, match=message):
        call[impl](**args)


def test_propose_rejects_a_negative_temperature():
    model, hidden, locs, anchors, seeds, positions = _draft(torch.float32)
    with pytest.raises(ValueError, match="temperature=-0.5 is invalid: expected >= 0"):
        model.propose(hidden, locs, anchors, 4, -0.5, seeds, positions)


def test_cuda_implementation_is_registered():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("dspark::markov_head_sample", "CUDA")


@pytest.mark.parametrize(
    "dtype,fused", [(torch.bfloat16, True), (torch.float16, True), (torch.float32, False)]
)
@pytest.mark.parametrize("temperature", [0.0, "mixed"])
def test_cuda_implementation_runs_the_fused_kernel_for_half_heads(
    monkeypatch, dtype, fused, temperature
):
    """``markov_head_sample_triton`` (the op's CUDA kernel) on ``DEVICE``: the in-kernel
    head for float16/bfloat16 factors, the reference for float32; either way
    ``sample_sequential``'s tokens. On CPU the Triton interpreter runs it, with dyadic
    heads (``test_markov_head_sampling._head``: the bias is exact)."""
    head, base, anchors, seeds, positions, temps = head_cases._case(5, 2, 100, 8, dtype, 9)
    as_float, as_tensor = _temperature(temperature, temps)
    launches = []
    fused_sampler = head_triton.sample_sequential_factors_triton
    monkeypatch.setattr(
        head_triton,
        "sample_sequential_factors_triton",
        lambda *args: launches.append(args) or fused_sampler(*args),
    )
    got = head_triton.markov_head_sample_triton(
        base, anchors, *head.low_rank_factors(), as_tensor, seeds, positions
    )
    with torch.no_grad():
        want = sample_sequential(base, anchors, head, as_float, seeds, positions)
    assert torch.equal(got, want)
    assert len(launches) == int(fused)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the op's CUDA kernel needs a GPU")
@pytest.mark.parametrize("temperature", [0.0, 1.0, "mixed"])
def test_op_on_cuda_equals_sample_sequential_for_a_bf16_head(temperature):
    """Randomly initialised bf16 head (``test_markov_head_sampling._case`` on CUDA): the
    dispatcher's CUDA kernel, and ``propose`` of a bf16 draft on CUDA."""
    head, base, anchors, seeds, positions, temps = head_cases._case(
        9, 4, 3000, 64, torch.bfloat16, 21
    )
    as_float, as_tensor = _temperature(temperature, temps)
    with torch.no_grad():
        want = sample_sequential(base, anchors, head, as_float, seeds, positions)
    assert torch.equal(
        OP(base, anchors, *head.low_rank_factors(), as_tensor, seeds, positions), want
    )
    model, hidden, locs, anchors, seeds, positions = _draft(torch.bfloat16)
    model, hidden, locs, anchors, seeds, positions = (
        model.cuda(),
        hidden.cuda(),
        locs.cuda(),
        anchors.cuda(),
        seeds.cuda(),
        positions.cuda(),
    )
    temperature = as_tensor[:3] if temperature == "mixed" else as_float
    want = _propose_with_module(model, hidden, locs, anchors, 4, temperature, seeds, positions)
    assert torch.equal(model.propose(hidden, locs, anchors, 4, temperature, seeds, positions), want)
