"""One record of what each pass did (``passes/record.py``): every way a pass runs (the
pass manager, calling a ``GraphPass`` directly, any object with ``name`` and ``apply``
as the vLLM pass is) leaves exactly one ``PassRecord`` per pass and graph, with the
counters the pass declares (``stat_keys``, constants of ``passes/stats.py``)."""

import logging

import torch
import torch.fx

import dspark_compile
from dspark_compile import DraftWindowConfig
from dspark_compile.passes import DraftWindowPass, DSparkNonCausalIndexPass, PassManager, stats
from dspark_compile.passes.base import GraphPass
from dspark_compile.passes.record import run_pass

STAT_CONSTANTS = {v for k, v in vars(stats).items() if k.isupper() and not k.endswith("_PASS")}


def _graph() -> torch.fx.Graph:
    return torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2).graph


def _passes(sinks: int = 0):
    config = DraftWindowConfig(draft_window_size=64, method="dspark", draft_sink_size=sinks)
    return [DraftWindowPass(config, decompositions="none"), DSparkNonCausalIndexPass(config)]


def test_the_manager_records_each_pass_once_under_one_graph_id(caplog):
    dspark_compile.clear_pass_records()
    stages = []
    manager = PassManager(_passes(), graph_hook=lambda stage, graph: stages.append(stage))
    with caplog.at_level(logging.DEBUG, logger="dspark_compile.passes.record"):
        manager(_graph())
    records = dspark_compile.pass_records()
    assert [r.pass_name for r in records] == ["draft_window", "dspark_noncausal_indices"]
    assert len({r.graph_id for r in records}) == 1
    assert stages == [
        "before_draft_window",
        "after_draft_window",
        "before_dspark_noncausal_indices",
        "after_dspark_noncausal_indices",
    ]
    logged = [r.getMessage() for r in caplog.records if r.name == "dspark_compile.passes.record"]
    assert len(logged) == 2 and "draft_window: attention_calls=0" in logged[0]


def test_calling_a_pass_records_it_like_the_manager():
    dspark_compile.clear_pass_records()
    [window, noncausal] = _passes()
    window(_graph())
    noncausal(_graph())
    records = dspark_compile.pass_records()
    assert [r.pass_name for r in records] == ["draft_window", "dspark_noncausal_indices"]
    assert records[0].graph_id != records[1].graph_id  # two graphs


def test_every_pass_reports_its_declared_counters_from_stats_py():
    for sinks in (0, 16):
        for graph_pass in _passes(sinks):
            reported = graph_pass.apply(_graph())
            declared = graph_pass.stat_keys
            if sinks and graph_pass.name == "draft_window":
                declared += (stats.WITH_SINKS,)
            assert tuple(reported) == declared, graph_pass.name
            assert set(declared) <= STAT_CONSTANTS
    # negative control: an undeclared counter is not one of stats.py's
    assert "rewriten" not in STAT_CONSTANTS


def test_any_pass_with_a_name_and_apply_is_recorded_the_same_way():
    """The vLLM pass is not a ``GraphPass`` (it derives from vLLM's ``InductorPass``) but
    records through the same function."""

    class Counting:
        name = "counting"

        def apply(self, graph):
            return {stats.ATTENTION_CALLS: len(graph.nodes)}

    dspark_compile.clear_pass_records()
    assert run_pass(Counting(), _graph(), graph_id=7) == {"attention_calls": 4}
    [record] = dspark_compile.pass_records()
    assert (record.graph_id, record.pass_name, record.stats) == (
        7,
        "counting",
        {"attention_calls": 4},
    )
    assert not isinstance(Counting(), GraphPass)
