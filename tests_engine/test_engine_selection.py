"""An inherited ``DSPARK_ENGINES`` cannot turn the engine tier into a green run of skips
(issue 39, item 5e): collection fails when the selection leaves no collected engine test
to run, or names an unknown engine. Negative controls: the selections that must be
refused are; and a pytest run with such a selection exits with a usage error, while the
same run with a matching selection collects. No engine is started (``--collect-only``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import check_engine_selection, engine_selection

HERE = Path(__file__).resolve().parent


def test_a_selection_that_runs_something_passes():
    check_engine_selection(None, ["self_off", "self_wide"])  # unset: all engines
    check_engine_selection(["self_wide"], ["self_off", "self_wide"])
    check_engine_selection(["self_off"], [])  # no engine test collected (another file)


def test_negative_control_a_selection_that_runs_nothing_fails():
    with pytest.raises(pytest.UsageError, match="selects none of the engines"):
        check_engine_selection(["eagle3"], ["self_off", "self_wide"])


def test_negative_control_an_unknown_engine_fails(monkeypatch):
    monkeypatch.setenv("DSPARK_ENGINES", "self_off,fa_self_off")
    with pytest.raises(pytest.UsageError, match=r"unknown engines \['fa_self_off'\]"):
        engine_selection({"self_off": {}})
    monkeypatch.setenv("DSPARK_ENGINES", "")
    assert engine_selection({"self_off": {}}) is None


def _collect(selection: str, keyword: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DSPARK_ENGINES", "PYTEST_ADDOPTS")}
    env["DSPARK_ENGINES"] = selection
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"]
        + ["-k", keyword, str(HERE / "test_engine.py")],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(
    os.environ.get("DSPARK_ENGINE_DEVICE", "cpu") != "cpu", reason="names the CPU engines"
)
def test_an_inherited_selection_that_skips_every_collected_test_fails_the_run():
    """``-k narrow_window_on_long`` collects the narrow-window tests (engine
    ``self_narrow``): ``DSPARK_ENGINES=self_off`` would skip every one of them."""
    keyword = "narrow_window_on_long"
    refused = _collect("self_off", keyword)
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout + refused.stderr
    assert "selects none of the engines" in refused.stdout + refused.stderr
    accepted = _collect("self_off,self_narrow", keyword)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
