"""Does this Triton's interpreter run our kernels? (A property of triton + NumPy, not of torch.)

Triton 3.6's interpreter turns a tensor used as a Python index (a ``range``
bound computed from ``tl.program_id``) into an int with ``int(array)`` on a
1-element array. NumPy >= 2.4 rejects that ("only 0-dimensional arrays can be
converted to Python scalars"; deprecated since NumPy 1.25); Triton 3.8's
interpreter squeezes first. Every kernel of ours with such a loop bound then
fails under ``TRITON_INTERPRET=1``, whatever the torch version.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Optional

import torch

DEFECT_TEXT = "only 0-dimensional arrays can be converted to Python scalars"


@functools.cache
def interpreter_defect() -> Optional[str]:
    """A skip reason when the interpreter has the defect above, else None."""
    try:
        import numpy
        import triton
        import triton.language as tl
    except ImportError:
        return None

    def _loop_from_program_id(out_ptr, n):
        total = 0
        for i in range(tl.program_id(0) * 1, n):
            total += i
        tl.store(out_ptr, total)

    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel is decorated
    try:
        kernel = triton.jit(_loop_from_program_id)
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved

    out = torch.zeros(1, dtype=torch.int32)
    try:
        kernel[(1,)](out, 3)
    except Exception as error:  # noqa: BLE001 - any failure is the finding
        if DEFECT_TEXT in repr(error):
            return (
                f"triton {triton.__version__}'s interpreter cannot take a tensor as a loop "
                f"bound with NumPy {numpy.__version__} ({DEFECT_TEXT}); fixed in triton "
                "3.8's interpreter, or use NumPy < 2.4"
            )
        raise
    assert int(out) == 3, "interpreter probe computed a wrong sum"
    return None


def _raised_inside(error: BaseException, directory: Path) -> bool:
    """Whether the innermost frame of ``error``'s traceback is in a file under ``directory``."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(directory)


def raised_by_defect(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it chains) is the interpreter defect: a
    ``TypeError`` with NumPy's message, raised inside Triton's own code. The same
    message from anywhere else (our code, a test) is a real failure."""
    try:
        import triton
    except ImportError:
        return False
    triton_dir = Path(triton.__file__).resolve().parent
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if (
            isinstance(error, TypeError)
            and DEFECT_TEXT in str(error)
            and _raised_inside(error, triton_dir)
        ):
            return True
        error = error.__cause__ or error.__context__
    return False
