"""Draft KV memory bounded by the window: the sliding-window length vLLM is given.

Pure arithmetic (no vLLM import); ``kv_memory.py`` hands the result to vLLM as
the draft layers' ``SlidingWindowSpec``. Notation: W the draft window, K the
future offset (``DraftWindowConfig.resolved_future_offset``), b the KV block
size of the draft layers' group, ``sw`` the sliding window vLLM is given.

**Window contract.** A draft query at absolute position p reads the keys
``j`` with ``lo(p) <= j <= p``, ``lo(p) = max(p + 1 + K - W, 0)`` (without
sinks the vLLM route is token exact: the backend's native window of ``W - K``
tokens, ``metadata.py``).

**What vLLM frees.** vLLM's ``SlidingWindowManager`` frees, each time it
schedules a request (``allocate_slots``, before allocating), the whole blocks
that lie entirely below ``c - sw + 1``, where ``c`` is the request's processed
computed tokens (target tokens computed and no longer in flight, after
rejected draft tokens are rolled back)::

    freed tokens = [0, floor(max(c - sw + 1, 0) / b) * b)

**Where the draft reads.** Every draft forward of this step or of a later one
(the draft's pass over the target's new tokens, each of its K - 1 further
single-token steps, a chunked prefill chunk, the recomputation after a
preemption, the continuation after a prefix-cache hit) queries positions
``p >= c``: the draft processes the tokens the target computes in the step
(starting at ``c``) and positions beyond them. So the lowest key any of them
reads is ``lo(c) = max(c + 1 + K - W, 0)``.

**Invariant (nothing still read is ever freed).** For every ``c``, ``b``:
``floor(max(c - sw + 1, 0) / b) * b <= max(c + 1 + K - W, 0)``, which holds for
all ``c`` and ``b`` iff ``sw >= W - K`` (``b = 1`` is the binding case). The
smallest such ``sw`` keeps the least memory::

    sw = W - K                                   (draft_sliding_window)

It is also vLLM's own semantics of ``sliding_window = W - K`` (a query at p
sees ``(p - sw, p]``), i.e. exactly the native window the layer runs with, so
every block that vLLM keeps is one the draft may read and vice versa (up to
block alignment). Block alignment only makes vLLM free less (whole blocks).

**Prefix caching.** A hit of ``h`` tokens (a multiple of b) on a
sliding-window group needs the ``ceil((sw - 1) / b)`` blocks before ``h``
cached (vLLM's ``SlidingWindowManager.find_longest_cache_hit``); the draft's
first query after the hit, at ``h``, reads ``[h + 1 + K - W, h) = [h - sw + 1, h)``,
which lies in exactly those blocks (``cache_hit_blocks``).

**Sinks** (``draft_sink_size`` S > 0): a query also reads ``[0, S_b)``
forever, which no sliding-window spec keeps: the draft's memory is then NOT
bounded (``kv_memory.py`` warns and leaves the spec full).

**Capacity** (``capacity_tokens``): vLLM sizes a request's sliding-window
blocks by its admission cap ``ceil(min(sw - 1 + T, L) / b) + 1`` blocks, with
``T = max_in_flight_tokens`` (``max_num_batched_tokens`` times the concurrent
batches: 2 with async scheduling) and L = ``max_model_len``; a full-attention
group holds ``ceil(L / b)``. The KV capacity vLLM reports is
``max_concurrency * L``. The fraction of the draft's cost won back
(``recovered_fraction``) therefore depends on ``T`` as much as on W.
"""

from __future__ import annotations

from dspark_compile.config import WindowSpec


def _check(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid: expected an int >= {minimum}")


def draft_sliding_window(window_size: int, future_offset: int) -> int:
    """The ``sliding_window`` of the draft layers' vLLM KV spec: ``W - K`` (module doc;
    ``config.WindowSpec`` validates W and K)."""
    return WindowSpec(window_size, future_offset, 1).tokens


def lowest_key_read(position: int, window_size: int, future_offset: int) -> int:
    """``lo(p) = max(p + 1 + K - W, 0)``: the lowest key a draft query at ``p`` reads."""
    return max(position + 1 + future_offset - window_size, 0)


def freed_tokens(computed_tokens: int, sliding_window: int, block_size: int) -> int:
    """Tokens ``[0, n)`` vLLM's sliding-window manager has freed at ``c`` processed
    computed tokens: whole blocks below ``c - sw + 1``."""
    skipped = max(computed_tokens - sliding_window + 1, 0)
    return skipped // block_size * block_size


def cache_hit_blocks(sliding_window: int, block_size: int) -> int:
    """Blocks before a prefix-cache hit that vLLM requires cached for a sliding-window
    group (without the EAGLE extra block): ``ceil((sw - 1) / b)``."""
    return -(-(sliding_window - 1) // block_size)


def sliding_blocks_per_request(
    sliding_window: int, block_size: int, max_in_flight_tokens: int, max_model_len: int
) -> int:
    """vLLM's admission cap for one request of a sliding-window group, in blocks
    (``SlidingWindowSpec.max_admission_blocks_per_request``)."""
    tokens = min(sliding_window - 1 + max_in_flight_tokens, max_model_len)
    return -(-tokens // block_size) + 1


def full_blocks_per_request(block_size: int, max_model_len: int) -> int:
    return -(-max_model_len // block_size)


def capacity_tokens(num_blocks: int, blocks_per_request: int, max_model_len: int) -> int:
    """The "KV cache size" vLLM reports: ``int(num_blocks / blocks_per_request * L)``."""
    return int(num_blocks / blocks_per_request * max_model_len)


def recovered_fraction(no_spec: float, with_draft: float, with_window: float) -> float:
    """Share of the capacity the draft costs (``no_spec - with_draft``) that the
    window wins back (``with_window - with_draft``)."""
    cost = no_spec - with_draft
    if cost <= 0:
        raise ValueError(
            f"the draft costs no capacity (no_spec={no_spec}, with_draft={with_draft})"
        )
    return (with_window - with_draft) / cost


def predicted_recovered_fraction(
    window_size: int,
    future_offset: int,
    block_size: int,
    max_in_flight_tokens: int,
    max_model_len: int,
    target_layers: int,
    draft_layers: int,
) -> float:
    """The fraction ``recovered_fraction`` predicts for a draft whose layers have the
    same KV page size as the target's, in vLLM's hybrid layout where
    ``target_layers == draft_layers`` (one full group, one sliding group; a
    self-draft): capacity is ``pool / (page * group) / blocks_per_request * L``."""
    if target_layers != draft_layers:
        raise ValueError("the prediction covers target_layers == draft_layers only")
    sw = draft_sliding_window(window_size, future_offset)
    full = full_blocks_per_request(block_size, max_model_len)
    sliding = sliding_blocks_per_request(sw, block_size, max_in_flight_tokens, max_model_len)
    # In units of P * L / (p * n) (pool P bytes, page p, n layers per group): no
    # speculation P / (p n) blocks, `full` per request; self-draft one group of 2n
    # layers, P / (2 p n) blocks; window two groups of n layers sharing tensors,
    # P / (p n) blocks, `full + sliding` per request.
    no_spec = 1.0 / full
    with_draft = 0.5 / full
    with_window = 1.0 / (full + sliding)
    return recovered_fraction(no_spec, with_draft, with_window)
