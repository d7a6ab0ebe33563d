"""Launch a small ``@triton.jit`` kernel through its compiled variant, without the JIT's
per-call dispatch.

``JITFunction.run`` binds and specializes every argument, hashes a cache key and looks
the variant up on every launch: tens of microseconds of host time, which a kernel that
runs between a host-bound draft model's layers pays on every draft forward.
``CompiledLaunches`` launches the first call of a caller-given key through the JIT and
keeps the ``CompiledKernel`` it returns; later calls of that key go straight to the
variant's launcher (``CompiledKernel[grid](*args)``).

The key is the caller's promise that it determines the variant: the kernel must not
specialize on argument VALUES (every integer argument in ``do_not_specialize`` and every
pointer in ``do_not_specialize_on_alignment``), so the variant depends only on the
device, the pointers' dtypes, whether each integer fits in 32 bits, and the constexprs,
and the key must name all of them.

The first direct launch of a key runs ``check`` (a caller's comparison against its torch
reference, which may synchronize); a key whose check fails, or whose launch raises, goes
back to the JIT for good and a warning is logged, so a Triton version whose launcher
differs costs speed, never a wrong value. Keys not yet checked take the JIT while a CUDA
graph is being captured (the check cannot synchronize there). Under ``TRITON_INTERPRET``
the JIT returns no compiled kernel and every call takes the JIT.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Hashable, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

_JIT_ONLY = object()  # a key whose direct launch failed its check or raised


class CompiledLaunches:
    """Per-key compiled variants of one ``@triton.jit`` kernel (module docstring)."""

    def __init__(self, kernel: Any, name: str, direct: bool = True) -> None:
        """``direct=False``: every call through the JIT (a baseline for benchmarks)."""
        self._kernel = kernel
        self._name = name
        self._direct = direct
        self._variants: dict[Hashable, Any] = {}
        self._checked: set[Hashable] = set()

    def launch(
        self,
        key: Hashable,
        grid: tuple[int, ...],
        args: Sequence[Any],
        check: Optional[Callable[[], bool]] = None,
    ) -> None:
        """Launch ``kernel[grid](*args)`` (``args``: every parameter in order, constexprs
        included); through the compiled variant of ``key`` once the JIT has built it."""
        if not self._direct:
            self._kernel[grid](*args)
            return
        variant = self._variants.get(key)
        if variant is None:
            compiled = self._kernel[grid](*args)
            self._variants[key] = compiled if _is_compiled(compiled) else _JIT_ONLY
            return
        if variant is _JIT_ONLY:
            self._kernel[grid](*args)
            return
        if key in self._checked:
            variant[grid](*args)
            return
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            self._kernel[grid](*args)
            return
        try:
            variant[grid](*args)
            ok = check() if check is not None else True
        except Exception as err:  # a launcher this Triton does not call this way
            logger.warning(
                "%s: the direct launch of variant %s raised %r; this variant goes "
                "through Triton's JIT from now on",
                self._name,
                key,
                err,
            )
            self._variants[key] = _JIT_ONLY
            self._kernel[grid](*args)
            return
        if not ok:
            logger.warning(
                "%s: the direct launch of variant %s disagreed with its reference; this "
                "variant goes through Triton's JIT from now on",
                self._name,
                key,
            )
            self._variants[key] = _JIT_ONLY
            self._kernel[grid](*args)
            return
        self._checked.add(key)

    def direct_keys(self) -> set[Hashable]:
        """The keys launched directly (checked); for tests and logs."""
        return set(self._checked)

    def jit_only_keys(self) -> set[Hashable]:
        return {key for key, variant in self._variants.items() if variant is _JIT_ONLY}


def _is_compiled(kernel: Any) -> bool:
    try:
        from triton.compiler import CompiledKernel
    except ImportError:  # pragma: no cover - every Triton this package accepts has it
        return False
    return isinstance(kernel, CompiledKernel)


def fits_int32(*values: int) -> bool:
    """Whether Triton passes every one of ``values`` as an ``i32`` (else ``i64``)."""
    return all(-(2**31) <= v < 2**31 for v in values)
