"""Run-time window mechanism: metadata windowed on each step (used by the vLLM route)."""

from dspark_compile.runtime.sliding_window import SlidingWindowAdapter, WindowedMetadata

__all__ = ["SlidingWindowAdapter", "WindowedMetadata"]
