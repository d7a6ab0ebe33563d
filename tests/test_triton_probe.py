"""The conftest skips a failure only for the known Triton-interpreter/NumPy defect."""

from pathlib import Path

import pytest

from tests.triton_probe import DEFECT_TEXT, raised_by_defect

triton = pytest.importorskip("triton")
INSIDE_TRITON = str(Path(triton.__file__).resolve().parent / "runtime" / "interpreter.py")


def _raise_from(filename: str, error: BaseException) -> BaseException:
    """``error`` as raised by code whose frame reports ``filename``."""
    try:
        exec(compile("raise error", filename, "exec"), {"error": error})
    except BaseException as raised:  # noqa: BLE001 - returned for inspection
        return raised
    raise AssertionError("nothing was raised")


def test_the_defect_raised_inside_triton_is_recognised():
    assert raised_by_defect(_raise_from(INSIDE_TRITON, TypeError(DEFECT_TEXT)))


def test_the_defect_chained_under_another_error_is_recognised():
    inner = _raise_from(INSIDE_TRITON, TypeError(DEFECT_TEXT))
    outer = RuntimeError("kernel launch failed")
    outer.__cause__ = inner
    assert raised_by_defect(outer)


def test_the_same_message_from_outside_triton_is_a_real_failure():
    assert not raised_by_defect(_raise_from(__file__, TypeError(DEFECT_TEXT)))


def test_another_error_type_inside_triton_is_a_real_failure():
    assert not raised_by_defect(_raise_from(INSIDE_TRITON, ValueError(DEFECT_TEXT)))
    assert not raised_by_defect(_raise_from(INSIDE_TRITON, TypeError("something else")))
