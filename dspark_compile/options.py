"""The ``options={...}`` of ``backend="dspark"``: parsing and validation.

``parse_options`` splits the options into the window config
(``DraftWindowConfig``) and the backend settings (``BackendSettings``) and
checks everything at once: unknown keys, ``lowering``, ``mode`` (Inductor's
modes), ``inductor_config`` keys and value types, ``torchair_mode``, and
options that have no effect in the chosen lowering. Every problem raises
``OptionError``, a ``ValueError`` naming the option, the value and what is
allowed, with a "did you mean" for near misses.

When to validate: ``torch.compile(fn, backend="dspark", options=...)`` stores
the options and hands them to the backend only when Dynamo compiles the first
graph (torch's ``_TorchCompileWrapper`` calls nothing of the backend before),
so a string backend is validated at the first call. ``OptionError`` then
reaches the caller as itself, not wrapped in ``BackendCompilerFailed``.
``dspark_compile.backend.configured_backend(options)`` validates immediately.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional

import torch

from dspark_compile.config import DraftWindowConfig
from dspark_compile.routes.torchair import TORCHAIR_MODES
from dspark_compile.validation import check_choice, did_you_mean

LOWERINGS = ("inductor", "aot_eager")
BACKEND_OPTIONS = ("lowering", "mode", "inductor_config", "torchair_mode")


@functools.cache
def _option_error_base() -> tuple[type, ...]:
    # Dynamo re-raises backend exceptions deriving from ShortenTraceback as they are
    # (others become BackendCompilerFailed); without it, a plain ValueError.
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # pragma: no cover - torch without the class
        return (ValueError,)
    return (ValueError, ShortenTraceback)


class OptionError(*_option_error_base()):  # type: ignore[misc]
    """A bad ``options`` entry (a ``ValueError``)."""

    def __init__(self, message: str) -> None:
        if len(_option_error_base()) == 2:  # ShortenTraceback takes the frame to cut at
            _option_error_base()[1].__init__(self, message, first_useful_frame=None)
        else:  # pragma: no cover
            ValueError.__init__(self, message)


def valid_options() -> tuple[str, ...]:
    """Every key ``options=`` accepts."""
    return DraftWindowConfig.field_names() + BACKEND_OPTIONS


def inductor_modes() -> tuple[str, ...]:
    """The ``mode`` values Inductor knows (``torch._inductor.list_mode_options()``)."""
    return tuple(torch._inductor.list_mode_options())


@dataclasses.dataclass(frozen=True)
class BackendSettings:
    """How the backend lowers the graph (the non-window options)."""

    lowering: str = "inductor"
    mode: Optional[str] = None
    inductor_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    torchair_mode: Optional[str] = None  # None: "max-autotune" on the NPU route

    @property
    def resolved_torchair_mode(self) -> str:
        return self.torchair_mode or "max-autotune"

    def check_route(self, on_npu: bool) -> None:
        """Options with no effect on the route the inputs' device selects are errors."""
        if on_npu:
            for name, value, default in (
                ("lowering", self.lowering, "inductor"),
                ("mode", self.mode, None),
                ("inductor_config", dict(self.inductor_config), {}),
            ):
                if value != default:
                    raise OptionError(
                        f"{name}={value!r} has no effect: the inputs are on an Ascend npu "
                        "device, so the graph goes to torchair; set torchair_mode instead"
                    )
        elif self.torchair_mode is not None:
            raise OptionError(
                f"torchair_mode={self.torchair_mode!r} has no effect: it selects the compiler "
                "on the Ascend route, and the inputs are not on an npu device"
            )


def parse_options(
    options: Optional[Mapping[str, Any]],
    mode: Optional[str] = None,
) -> tuple[DraftWindowConfig, BackendSettings]:
    """Split and validate ``options`` (and ``torch.compile``'s ``mode``, if given)."""
    if options is not None and not isinstance(options, Mapping):
        raise OptionError(f"options={options!r} is invalid: expected a dict")
    options = dict(options or {})
    unknown = sorted(set(options) - set(valid_options()), key=str)
    if unknown:
        key = unknown[0]
        raise OptionError(
            f"unknown dspark option {key!r}={options[key]!r}: valid options are "
            f"{', '.join(valid_options())}{did_you_mean(key, valid_options())}"
        )
    settings = {key: options.pop(key) for key in BACKEND_OPTIONS if key in options}
    if mode is not None and settings.get("mode", mode) != mode:
        raise OptionError(
            f"mode={settings['mode']!r} in options conflicts with "
            f"torch.compile(mode={mode!r}): give it once"
        )
    if mode is not None:
        settings["mode"] = mode
    try:
        _check_backend_settings(settings)
        config = DraftWindowConfig.from_mapping(options)
    except OptionError:
        raise
    except ValueError as error:
        raise OptionError(str(error)) from None
    return config, BackendSettings(**settings)


def _check_backend_settings(settings: dict[str, Any]) -> None:
    lowering = settings.get("lowering", "inductor")
    check_choice("lowering", lowering, LOWERINGS)
    if "mode" in settings and settings["mode"] is not None:
        check_choice("mode", settings["mode"], inductor_modes())
    inductor_config = settings.get("inductor_config", {})
    if not isinstance(inductor_config, Mapping):
        raise OptionError(
            f"inductor_config={inductor_config!r} is invalid: expected a dict of "
            "torch._inductor.config settings"
        )
    check_inductor_config(inductor_config)
    if lowering == "aot_eager":
        for name in ("mode", "inductor_config"):
            if settings.get(name):
                raise OptionError(
                    f"{name}={settings[name]!r} has no effect with lowering='aot_eager' (the "
                    f"graph runs eagerly after our passes): drop {name}, or use "
                    "lowering='inductor'"
                )
    if settings.get("torchair_mode") is not None:
        check_choice("torchair_mode", settings["torchair_mode"], TORCHAIR_MODES)


def check_inductor_config(patches: Mapping[str, Any]) -> None:
    """Every key is a ``torch._inductor.config`` setting and every value has its type."""
    from torch._inductor import config as inductor_config

    defaults = inductor_config.get_config_copy()
    for key, value in patches.items():
        if key not in defaults:
            raise OptionError(
                f"inductor_config key {key!r} is invalid: expected a torch._inductor.config "
                f"setting (dotted for nested ones, e.g. 'triton.cudagraphs')"
                f"{did_you_mean(key, defaults)}"
            )
        expected = _expected_type(defaults[key])
        if expected is not None and not _has_type(value, expected):
            raise OptionError(
                f"inductor_config[{key!r}]={value!r} is invalid: expected a "
                f"{expected.__name__} (its default is {defaults[key]!r})"
            )


def _expected_type(default: Any) -> Optional[type]:
    """The type a value must have, from the setting's default (None: not checked)."""
    for kind in (bool, int, float, str):
        if type(default) is kind:
            return kind
    return None


def _has_type(value: Any, expected: type) -> bool:
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expected)
