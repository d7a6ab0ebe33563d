"""dspark_compile.inspect: depyf dump with before/after graphs, output code and summary.md."""

import inspect as pyinspect
import re

import depyf
import pytest
import torch
from torch._inductor.codecache import PyCodeCache

import dspark_compile
from dspark_compile.integrations.depyf_dump import depyf_debug
from dspark_compile.tools.inspection import reference_draft_example

ATTENTION_LINE = re.compile(r"= torch\.ops\.dspark\.paged_attention\.default\(([^)]*)\)")


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    """One Inductor inspection of a 2-layer reference draft, and the pass records it made."""
    torch._dynamo.reset()
    dspark_compile.clear_pass_records()
    model, inputs = reference_draft_example(context_len=96, num_layers=2)
    report = dspark_compile.inspect(
        model,
        *inputs,
        dump_dir=tmp_path_factory.mktemp("dump"),
        options={"draft_window_size": 32, "method": "dflash"},
    )
    return report, dspark_compile.pass_records()


def _attention_args(path):
    return [
        [a.strip() for a in m.group(1).split(",")]
        for m in ATTENTION_LINE.finditer(path.read_text())
    ]


def test_dump_has_depyf_code_graphs_before_and_after_and_output_code(inspected):
    report, _ = inspected
    names = {p.name for p in report.dump_dir.iterdir()}
    assert any(n.startswith("full_code_for_") for n in names)  # depyf's decompiled code
    assert any(n.startswith("__transformed_code_") for n in names)
    [record] = report.passes
    assert record.before_file in names and record.after_file in names
    assert record.before_file.endswith("dspark_before_draft_window.0.py")
    assert any(re.search(r"\.kernel_\d+\.py$", n) for n in names)  # Inductor output code
    assert "summary.md" in names


def test_after_graph_has_window_arithmetic_and_rewired_attention(inspected):
    report, _ = inspected
    [record] = report.passes
    before = report.dump_dir / record.before_file
    after = report.dump_dir / record.after_file
    after_text = after.read_text()
    assert "torch.ops.aten.gather.default(" in after_text
    assert "rounding_mode = 'floor'" in after_text
    assert "gather" not in before.read_text()
    # (query, key_cache, value_cache, block_table, seq_lens, ...): every call read the
    # graph inputs before the pass and reads the one shared window after it.
    before_args, after_args = _attention_args(before), _attention_args(after)
    assert len(before_args) == len(after_args) == 2
    assert all(
        re.fullmatch(r"arg\d+_1", a[3]) and re.fullmatch(r"arg\d+_1", a[4]) for a in before_args
    )
    assert {(a[3], a[4]) for a in after_args} == {
        (c.block_table_after, c.seq_lens_after) for c in record.attention_calls
    }
    [(table, lens)] = {(a[3], a[4]) for a in after_args}
    # torch >= 2.14: views of one packed window buffer (else: sub / mul results).
    assert re.search(rf"\b{lens}: \"i32\[2\]\" = torch\.ops\.aten\.(as_strided|sub)\.", after_text)
    assert re.search(
        rf"\b{table}: \"i32\[2, 3\]\" = torch\.ops\.aten\.(as_strided|mul)\.", after_text
    )  # ceil(32/16) + 1 columns


def test_summary_counts_equal_the_pass_managers(inspected):
    report, records = inspected
    summary = report.summary_path.read_text()
    [record] = [r for r in records if r.pass_name == "draft_window"]
    table = dict(re.findall(r"^\| (\w+) \| (\d+) \|$", summary, re.MULTILINE))
    assert {k: int(v) for k, v in table.items()} == record.stats
    totals = dict(
        re.findall(
            r"^- (attention_calls|rewritten|window_computations): (\d+)$", summary, re.MULTILINE
        )
    )
    assert {k: int(v) for k, v in totals.items()} == {
        k: record.stats[k] for k in ("attention_calls", "rewritten", "window_computations")
    }
    assert record.stats["attention_calls"] == record.stats["rewritten"] == 2
    assert record.stats["window_computations"] == 1
    assert "draft_window_size (W): 32" in summary
    assert summary.count("rewritten: (") == 2


def test_summary_names_the_generated_kernels(inspected):
    report, _ = inspected
    summary = report.summary_path.read_text()
    [(kernel_file, kernels)] = report.kernels.items()
    assert kernels and all(k.startswith("cpp_fused_") for k in kernels)
    source = (report.dump_dir / kernel_file).read_text()
    for kernel in kernels:
        assert f"`{kernel}`" in summary
        assert f"{kernel} = async_compile." in source


@pytest.mark.filterwarnings("ignore:.*You are trying to debug")
def test_depyf_hook_takes_the_keywords_newer_inductor_passes(tmp_path):
    extra = (
        {"set_sys_modules": False}
        if "set_sys_modules" in pyinspect.signature(PyCodeCache.load).parameters
        else {}
    )
    source = "VALUE = 41 + 1\n"
    if extra:  # without the adapter, depyf 0.20's hook rejects them
        with pytest.raises(TypeError), depyf.prepare_debug(str(tmp_path / "plain")):
            PyCodeCache.load(source + "# plain\n", **extra)
    with depyf_debug(str(tmp_path / "adapted")):
        module = PyCodeCache.load(source, **extra)
    assert module.VALUE == 42
    dumped = [p for p in (tmp_path / "adapted").iterdir() if ".kernel_" in p.name]
    assert [p.read_text() for p in dumped] == [source]
    # Afterwards torch's own loader is back: keywords work and nothing is dumped.
    assert PyCodeCache.load("VALUE = 7\n", **extra).VALUE == 7
    assert len([p for p in (tmp_path / "adapted").iterdir() if ".kernel_" in p.name]) == 1


def test_inspect_refuses_a_used_dump_dir_and_bad_input(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="dump_dir=.* is not empty"):
        dspark_compile.inspect(dump_dir=tmp_path)
    with pytest.raises(ValueError, match="dump_dir=.* is not empty"):
        dspark_compile.inspect(dump_dir=tmp_path, overwrite=True)  # notes.txt is not a dump file
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="draft_window_size=-4 is invalid"):
        dspark_compile.inspect(dump_dir=tmp_path / "new", options={"draft_window_size": -4})
    assert not (tmp_path / "new").exists()
    with pytest.raises(TypeError, match="fn=3 is invalid"):
        dspark_compile.inspect(3, dump_dir=tmp_path / "new")
    with pytest.raises(ValueError, match="context_len=0 is invalid"):
        reference_draft_example(context_len=0)
