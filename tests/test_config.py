"""DraftWindowConfig validation and derived values."""

import logging

import pytest

from dspark_compile import DraftWindowConfig


@pytest.mark.parametrize(
    "method,expected",
    [("eagle3", 3), ("eagle", 3), ("draft_model", 3), ("dflash", 0), ("dspark", 0)],
)
def test_future_offset_derived_from_method(method, expected):
    config = DraftWindowConfig(draft_window_size=64, method=method, num_speculative_tokens=3)
    assert config.resolved_future_offset == expected


def test_explicit_future_offset_wins():
    config = DraftWindowConfig(draft_window_size=64, method="eagle3", future_offset=1)
    assert config.resolved_future_offset == 1


def test_off_by_default():
    assert not DraftWindowConfig().enabled


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("draft_window_size", 0, "positive int"),
        ("draft_window_size", -4, "positive int"),
        ("draft_window_size", 2.5, "positive int"),
        ("draft_window_size", "2048", "positive int"),
        ("draft_window_size", True, "positive int"),
        ("method", "medusa", "eagle3, eagle, draft_model, dflash, dspark, mtp"),
        ("num_speculative_tokens", 0, "positive int"),
        ("future_offset", -1, "non-negative int"),
        ("block_size", 0, "positive int"),
        ("deepseek_v4_target", "yes", "a bool"),
        ("draft_sink_size", -1, "non-negative int"),
        ("draft_sink_size", 1.5, "non-negative int"),
        ("draft_sink_size", True, "non-negative int"),
    ],
)
def test_bad_values_name_field_value_and_allowed(field, value, allowed):
    kwargs = {"draft_window_size": 64, field: value}
    with pytest.raises(ValueError) as err:
        DraftWindowConfig(**kwargs)
    message = str(err.value)
    assert f"{field}={value!r}" in message and allowed in message


def test_future_offset_must_be_inside_the_window():
    with pytest.raises(ValueError, match="future_offset=8 is invalid for draft_window_size=8"):
        DraftWindowConfig(draft_window_size=8, method="eagle3", num_speculative_tokens=8)


def test_mtp_warns_and_disables(caplog):
    with caplog.at_level(logging.WARNING, logger="dspark_compile.config"):
        config = DraftWindowConfig(draft_window_size=2048, method="mtp")
    assert not config.enabled and config.draft_window_size is None
    assert "method='mtp'" in caplog.text and "window disabled" in caplog.text


def test_dspark_with_deepseek_v4_target_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="dspark_compile.config"):
        config = DraftWindowConfig(draft_window_size=2048, method="dspark", deepseek_v4_target=True)
    assert config.enabled
    assert "DeepSeek-V4" in caplog.text


def test_from_mapping_rejects_unknown_keys():
    with pytest.raises(
        ValueError, match=r"unknown draft-window option\(s\) \['window'\].*draft_window_size"
    ):
        DraftWindowConfig.from_mapping({"window": 8})


def test_sink_size_defaults_to_zero_and_needs_the_window():
    assert DraftWindowConfig(draft_window_size=64).draft_sink_size == 0
    with pytest.raises(ValueError, match="draft_sink_size=16 is invalid without a window"):
        DraftWindowConfig(draft_sink_size=16)


def test_sink_size_is_part_of_the_hashed_config():
    plain, sinks = (
        DraftWindowConfig(draft_window_size=64),
        DraftWindowConfig(draft_window_size=64, draft_sink_size=16),
    )
    assert plain.as_dict()["draft_sink_size"] == 0 and sinks.as_dict()["draft_sink_size"] == 16
    assert plain != sinks and hash(plain) != hash(sinks)


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 0, 16), r"window_size=0 is invalid: expected a positive int"),
        ((True, 0, 16), r"window_size=True is invalid"),
        ((64, -1, 16), r"future_offset=-1 is invalid: expected an int >= 0"),
        ((64, 64, 16), r"future_offset=64 must be < window_size=64"),
        ((64, 3, 0), r"block_size=0 must be positive"),
        ((64, 3, 16, -1), r"sink_size=-1 is invalid: expected a non-negative int"),
    ],
)
def test_window_spec_validates_once_naming_argument_value_and_range(args, match):
    from dspark_compile.config import WindowSpec

    with pytest.raises(ValueError, match=match):
        WindowSpec(*args)


def test_window_spec_from_config_and_its_tokens():
    from dspark_compile.config import WindowSpec

    config = DraftWindowConfig(
        draft_window_size=64, method="eagle3", num_speculative_tokens=3, draft_sink_size=5
    )
    spec = WindowSpec.from_config(config, block_size=16)
    assert spec == WindowSpec(64, 3, 16, 5) and spec.tokens == 61
    own_b = DraftWindowConfig(draft_window_size=8, block_size=4)
    assert WindowSpec.from_config(own_b, block_size=16).block_size == 4
    with pytest.raises(ValueError, match="block_size=None is invalid"):
        WindowSpec.from_config(DraftWindowConfig(draft_window_size=64))
    with pytest.raises(ValueError, match="window is off"):
        WindowSpec.from_config(DraftWindowConfig(), block_size=16)


def test_cached_window_spec_is_validated_once_per_distinct_arguments():
    from dspark_compile.config import WindowSpec

    spec = WindowSpec.cached(64, 5, 16)
    assert spec == WindowSpec(64, 5, 16) and spec.tokens == 59
    assert WindowSpec.cached(64, 5, 16) is spec
    assert WindowSpec.cached(64, 5, 16, 4) == WindowSpec(64, 5, 16, 4)
    with pytest.raises(ValueError, match="future_offset=64 must be < window_size=64"):
        WindowSpec.cached(64, 64, 16)
    # typed: a bool is not the int it equals, and is refused as WindowSpec refuses it
    with pytest.raises(ValueError, match="window_size"):
        WindowSpec.cached(True, 0, 16)
