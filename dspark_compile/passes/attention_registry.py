"""Public registry of attention ops the window pass rewrites.

An entry names, by schema argument name, which inputs of the op carry the
device ``seq_lens``, the ``block_table``, host mirrors of seq_lens (CPU
tensors), scalar upper bounds of seq_lens (``max_seq_len``...) and the KV cache
whose dim 1 is the kernel block size.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch


@dataclasses.dataclass(frozen=True)
class AttentionOpSpec:
    """Where an attention op reads its KV length and block table."""

    op: torch._ops.OpOverload
    seq_lens: str
    block_table: str
    kv_cache: Optional[str] = None
    host_seq_lens: tuple[str, ...] = ()
    upper_bounds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.op, torch._ops.OpOverload):
            raise ValueError(
                f"op={self.op!r} is invalid: expected an OpOverload such as "
                "torch.ops.dspark.paged_attention.default")
        names = [a.name for a in self.op._schema.arguments]
        for field in ("seq_lens", "block_table", "kv_cache", "host_seq_lens", "upper_bounds"):
            value = getattr(self, field)
            for arg in (value if isinstance(value, tuple) else (value,)):
                if arg is not None and arg not in names:
                    raise ValueError(
                        f"{field}={arg!r} is not an argument of {self.op}: "
                        f"its arguments are {', '.join(names)}")

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

    register_attention_op(AttentionOpSpec(
        op=torch.ops.dspark.paged_attention.default,
        seq_lens="seq_lens", block_table="block_table", kv_cache="key_cache"))


_register_defaults()
