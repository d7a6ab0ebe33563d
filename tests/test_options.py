"""Validation of backend="dspark" options: ValueError naming option, value, allowed, near misses."""

import pytest
import torch

import dspark_compile
from dspark_compile.options import BackendSettings, OptionError, parse_options


@pytest.mark.parametrize(
    "options,pattern",
    [
        (
            {"draft_windw_size": 64},
            r"unknown dspark option 'draft_windw_size'=64: valid options are "
            r".*did you mean 'draft_window_size'\?",
        ),
        (
            {"lowering": "aot-eager"},
            r"lowering='aot-eager' is invalid: expected one of inductor, "
            r"aot_eager; did you mean 'aot_eager'\?",
        ),
        (
            {"mode": "max_autotune"},
            r"mode='max_autotune' is invalid: expected one of .*"
            r"max-autotune.*did you mean 'max-autotune'\?",
        ),
        (
            {"inductor_config": {"max_autotun": True}},
            r"inductor_config key 'max_autotun' is invalid: .*did you mean 'max_autotune'\?",
        ),
        (
            {"inductor_config": {"max_autotune": "yes"}},
            r"inductor_config\['max_autotune'\]='yes' is invalid: expected a bool",
        ),
        (
            {"inductor_config": {"triton.cudagraphs": 1}},
            r"inductor_config\['triton.cudagraphs'\]=1 is invalid: expected a bool",
        ),
        (
            {"inductor_config": [("max_autotune", True)]},
            r"inductor_config=.* is invalid: expected a dict",
        ),
        (
            {"lowering": "aot_eager", "mode": "max-autotune"},
            r"mode='max-autotune' has no effect with lowering='aot_eager'",
        ),
        (
            {"lowering": "aot_eager", "inductor_config": {"max_autotune": True}},
            r"inductor_config=\{'max_autotune': True\} has no effect with lowering='aot_eager'",
        ),
        ({"torchair_mode": "ge"}, r"torchair_mode='ge' is invalid: expected one of max-autotune"),
        ({"draft_window_size": 0}, r"draft_window_size=0 is invalid: expected a positive int"),
        (
            {"method": "eagle33"},
            r"method='eagle33' is invalid: expected one of eagle3, eagle, "
            r"draft_model, dflash, dspark, mtp; did you mean 'eagle3'\?",
        ),
    ],
)
def test_bad_options_raise_value_error_naming_option_value_and_allowed(options, pattern):
    with pytest.raises(ValueError, match=pattern) as error:
        parse_options(options)
    assert isinstance(error.value, OptionError)


def test_good_options_parse_into_config_and_settings():
    config, settings = parse_options(
        {
            "draft_window_size": 64,
            "method": "eagle3",
            "num_speculative_tokens": 2,
            "mode": "max-autotune-no-cudagraphs",
            "inductor_config": {
                "max_autotune": False,
                "triton.cudagraphs": False,
                "post_grad_custom_post_pass": None,
            },
        }
    )
    assert config.draft_window_size == 64 and config.resolved_future_offset == 2
    assert settings.mode == "max-autotune-no-cudagraphs" and settings.lowering == "inductor"
    assert parse_options(None)[1] == BackendSettings()


def test_mode_given_twice_must_agree():
    assert parse_options({}, mode="max-autotune")[1].mode == "max-autotune"
    with pytest.raises(
        ValueError,
        match=r"mode='default' in options conflicts with "
        r"torch.compile\(mode='max-autotune'\)",
    ):
        parse_options({"mode": "default"}, mode="max-autotune")


def test_options_with_no_effect_on_the_route_are_errors():
    BackendSettings(torchair_mode="npugraph_ex").check_route(on_npu=True)
    with pytest.raises(ValueError, match="torchair_mode='npugraph_ex' has no effect"):
        BackendSettings(torchair_mode="npugraph_ex").check_route(on_npu=False)
    with pytest.raises(ValueError, match="mode='max-autotune' has no effect: the inputs are on"):
        BackendSettings(mode="max-autotune").check_route(on_npu=True)


def test_configured_backend_validates_when_built():
    with pytest.raises(ValueError, match="did you mean 'draft_window_size'"):
        dspark_compile.configured_backend({"draft_window": 64})
    backend = dspark_compile.configured_backend({"draft_window_size": 8, "lowering": "aot_eager"})
    compiled = torch.compile(lambda x: x * 2, backend=backend)
    assert torch.equal(compiled(torch.arange(3)), torch.arange(3) * 2)


def test_string_backend_raises_the_value_error_itself_at_the_first_call():
    # torch.compile stores options and hands them over only when Dynamo compiles
    # the first graph: the earliest point for backend="dspark". The error is our
    # ValueError, not torch's BackendCompilerFailed.
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x + 1, backend="dspark", options={"mode": "max_autotune"})
    with pytest.raises(ValueError, match="did you mean 'max-autotune'") as error:
        compiled(torch.ones(2))
    assert type(error.value) is OptionError
