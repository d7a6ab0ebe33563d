"""The Markov-head sampling op: ``dspark.markov_head_sample``.

An opaque ``torch.library.custom_op`` (one node in a compiled graph; no graph break)
with a fake implementation that validates its arguments. The default (CPU, any device
without a kernel) implementation is the torch reference
``kernels.markov_sampling.markov_head_sample_ref``, the loop of ``sample_sequential``;
on CUDA, when Triton imports, ``markov_head_sample_triton`` computes the head's bias in
the sampling kernel for float16/bfloat16 factors and runs the reference otherwise.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from dspark_compile.kernels import markov_sampling as ref
from dspark_compile.kernels.sampling_args import check_head_sampling_args

logger = logging.getLogger(__name__)


@torch.library.custom_op("dspark::markov_head_sample", mutates_args=())
def markov_head_sample(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    embed: torch.Tensor,
    weight: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Sample ``[R, N]`` int64 draft tokens left to right from ``base_logits [R, N, V]``
    plus the low-rank Markov bias ``embed[prev] @ weight^T`` (``embed``, ``weight``:
    ``[V, r]``, one floating dtype) of the previous token, ``anchor_tokens [R]`` before
    step 0. ``temperature [R]`` (float32; 0: greedy), ``seeds [R]`` and ``positions [R]``
    (default 0) as in ``sample_sequential``.

    Semantics: ``dspark_compile.kernels.markov_sampling.markov_head_sample_ref``.
    """
    return ref.markov_head_sample_ref(
        base_logits, anchor_tokens, embed, weight, temperature, seeds, positions
    )


@markov_head_sample.register_fake
def _markov_head_sample_fake(
    base_logits, anchor_tokens, embed, weight, temperature, seeds, positions=None
):
    check_head_sampling_args(
        base_logits, anchor_tokens, embed, weight, temperature, seeds, positions
    )
    return base_logits.new_empty(base_logits.shape[:2], dtype=torch.int64)


def _register_triton_kernels() -> None:
    try:
        from dspark_compile.kernels.markov_head_sampling_triton import markov_head_sample_triton
    except ImportError as error:  # CPU-only installs without Triton keep the reference
        logger.info(
            "Triton unavailable (%s): dspark.markov_head_sample uses the torch reference", error
        )
        return
    markov_head_sample.register_kernel("cuda")(markov_head_sample_triton)


_register_triton_kernels()
