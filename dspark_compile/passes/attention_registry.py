"""Public registry of attention ops the window pass rewrites.

An entry names, by schema argument name, which inputs of the op carry the
device ``seq_lens``, the ``block_table``, host mirrors of seq_lens (CPU
tensors), scalar upper bounds of seq_lens (``max_seq_len``...) and the KV cache
whose dim 1 is the kernel block size; and, for an op that applies the
per-token draft window itself (``PerTokenWindowArgs``), where it takes that
window.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch


@dataclasses.dataclass(frozen=True)
class PerTokenWindowArgs:
    """Argument names through which an op applies the causal per-token window.

    ``query``: the ``[T, ...]`` query (T bounds every request's q_len);
    ``query_start_loc [R+1]``; ``causal``: a bool argument (only calls with a
    constant ``True`` get the per-token form); ``kv_offset [R]`` (absolute
    position of the windowed table's first token), ``window_size`` (W) and
    ``future_offset`` (K): the op must hide, from a query at absolute position
    p, every key before ``floor(max(p + 1 + K - W, 0) / b) * b``.
    ``sink_size`` (optional; None: the op takes no sinks): an int argument S;
    the op must keep keys at absolute positions ``< ceil(S / b) * b`` visible
    and read the windowed table's first ``min(ceil(S / b) * b, kv_offset)``
    tokens as those sink positions (``arithmetic.window.table_token_positions``).
    Without it the pass refuses ``draft_sink_size > 0`` for the op's causal calls.
    """

    query: str = "query"
    query_start_loc: str = "query_start_loc"
    causal: str = "causal"
    kv_offset: str = "kv_offset"
    window_size: str = "window_size"
    future_offset: str = "future_offset"
    sink_size: Optional[str] = None

    def names(self) -> tuple[str, ...]:
        """The argument names given (``sink_size`` only when set)."""
        return tuple(
            name
            for name in (getattr(self, f.name) for f in dataclasses.fields(self))
            if name is not None
        )


@dataclasses.dataclass(frozen=True)
class AttentionOpSpec:
    """Where an attention op reads its KV length and block table.

    Without ``per_token_window`` every call is windowed per request (the window
    of its last position): a causal query block longer than ``W - K`` then
    loses keys of its earliest queries. With it, causal calls get the
    per-token form (``dspark_compile.arithmetic.window.causal_window_metadata``).
    """

    op: torch._ops.OpOverload
    seq_lens: str
    block_table: str
    kv_cache: Optional[str] = None
    host_seq_lens: tuple[str, ...] = ()
    upper_bounds: tuple[str, ...] = ()
    per_token_window: Optional[PerTokenWindowArgs] = None

    def __post_init__(self) -> None:
        if not isinstance(self.op, torch._ops.OpOverload):
            raise ValueError(
                f"op={self.op!r} is invalid: expected an OpOverload such as "
                "torch.ops.dspark.paged_attention.default"
            )
        names = [a.name for a in self.op._schema.arguments]
        for field in ("seq_lens", "block_table", "kv_cache", "host_seq_lens", "upper_bounds"):
            value = getattr(self, field)
            for arg in value if isinstance(value, tuple) else (value,):
                if arg is not None and arg not in names:
                    raise ValueError(
                        f"{field}={arg!r} is not an argument of {self.op}: "
                        f"its arguments are {', '.join(names)}"
                    )
        if self.per_token_window is not None:
            for arg in self.per_token_window.names():
                if arg not in names:
                    raise ValueError(
                        f"per_token_window names {arg!r}, which is not an argument of "
                        f"{self.op}: its arguments are {', '.join(names)}"
                    )
            if self.host_seq_lens:
                raise ValueError(
                    f"host_seq_lens={self.host_seq_lens!r} with per_token_window is not "
                    "supported: a per-token window of a host mirror needs host query "
                    "lengths; register the op without one of them"
                )

    def arg_index(self, name: str) -> int:
        """Schema position of argument ``name`` of ``op``."""
        return [a.name for a in self.op._schema.arguments].index(name)


_REGISTRY: dict[torch._ops.OpOverload, AttentionOpSpec] = {}


def register_attention_op(spec: AttentionOpSpec) -> None:
    """Make the window pass rewrite every call of ``spec.op`` (replaces an earlier entry)."""
    _REGISTRY[spec.op] = spec


def unregister_attention_op(op: torch._ops.OpOverload) -> None:
    _REGISTRY.pop(op, None)


def attention_op_specs() -> dict[torch._ops.OpOverload, AttentionOpSpec]:
    """A copy of the registry: op -> spec."""
    return dict(_REGISTRY)


def _register_defaults() -> None:
    import dspark_compile.ops  # noqa: F401  (defines torch.ops.dspark.*)

    register_attention_op(
        AttentionOpSpec(
            op=torch.ops.dspark.paged_attention.default,
            seq_lens="seq_lens",
            block_table="block_table",
            kv_cache="key_cache",
            per_token_window=PerTokenWindowArgs(sink_size="sink_size"),
        )
    )


_register_defaults()
