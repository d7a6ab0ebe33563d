"""CUDA-graph capture shared by the graph checks and the benchmarks."""

from __future__ import annotations

from typing import Any, Callable

import torch


def capture_cuda_graph(fn: Callable[[], Any], warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Run ``fn`` ``warmup`` times on a side stream, then capture one call.

    Returns ``(graph, output)``: ``output`` is what the captured call returned; its
    tensors are the graph's static outputs, refreshed by every ``graph.replay()``.
    Capture fails if ``fn`` synchronises with the host.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()
    torch.cuda.synchronize()
    return graph, output
