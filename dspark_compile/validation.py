"""Argument checks and warn-once logging shared by every layer (imports nothing of ours).

Every check raises ``ValueError`` naming the argument, the value and what is
allowed (``"name=value is invalid: expected ..."``).
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Iterable

_WARNED: set[tuple[str, str]] = set()


def is_int(value: Any) -> bool:
    """A Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(
    name: str,
    value: Any,
    minimum: int = 1,
    allowed: str | None = None,
    allow_symbolic: bool = False,
) -> None:
    """Raise ``ValueError`` unless ``value`` is an int (not bool) ``>= minimum``.

    ``allow_symbolic``: a ``torch.SymInt`` passes (an op traced with a
    symbolic size; it is checked again when the op runs).
    """
    if allow_symbolic and type(value).__name__ == "SymInt":
        return
    if not is_int(value) or value < minimum:
        if allowed is None:
            allowed = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name}={value!r} is invalid: expected {allowed}")


def check_choice(name: str, value: Any, choices: Iterable[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices`` (with a "did you mean")."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(
            f"{name}={value!r} is invalid: expected one of {', '.join(choices)}"
            f"{did_you_mean(value, choices)}"
        )


def did_you_mean(value: Any, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""``."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def warn_once(logger: logging.Logger, key: str, message: str, *args: Any) -> None:
    """``logger.warning(message, *args)`` the first time ``(logger, key)`` is seen."""
    log_once(logger, logging.WARNING, key, message, *args)


def log_once(logger: logging.Logger, level: int, key: str, message: str, *args: Any) -> None:
    """``logger.log(level, message, *args)`` the first time ``(logger, key)`` is seen."""
    if (logger.name, key) in _WARNED:
        return
    _WARNED.add((logger.name, key))
    logger.log(level, message, *args)
