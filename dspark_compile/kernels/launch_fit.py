"""Retry a Triton launch with smaller shapes until it fits the GPU.

A default launch shape tuned on one GPU (e.g. the H200's 227 KiB of shared memory
per block) can exceed another's; Triton then raises ``OutOfResources`` before
anything is enqueued, so the launch can simply be repeated with a smaller shape.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, TypeVar

import triton

logger = logging.getLogger(__name__)

Shape = TypeVar("Shape")
Result = TypeVar("Result")


def launch_until_it_fits(
    launch: Callable[[Shape], Result],
    shape: Shape,
    smaller: Callable[[Shape], Optional[Shape]],
    what: str,
) -> tuple[Result, Shape]:
    """Call ``launch(shape)``; while it raises ``OutOfResources``, retry with
    ``smaller(shape)`` (``None``: none left, the error propagates). Each retry is
    logged. Returns ``launch``'s result and the shape that launched."""
    while True:
        try:
            return launch(shape), shape
        except triton.runtime.errors.OutOfResources as exc:
            next_shape = smaller(shape)
            if next_shape is None:
                raise
            logger.info(
                "%s: launch %s does not fit this GPU (%s); trying %s", what, shape, exc, next_shape
            )
            shape = next_shape
