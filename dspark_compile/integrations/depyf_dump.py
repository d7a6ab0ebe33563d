"""depyf dumps that survive newer Inductor, and graph logging depyf picks up.

``depyf_debug(dump_dir)`` is ``depyf.prepare_debug(dump_dir)`` plus one
adapter: depyf replaces ``PyCodeCache.load_by_key_path`` with a hook that
takes ``(key, path, linemap, attrs)`` only, while newer Inductor passes extra
keywords (torch 2.14: ``set_sys_modules``). When the installed hook cannot
take keywords the adapter forwards them to the original loader and lets
depyf's hook do its dump - depyf's files stay untouched.

``log_graph(name, graph)`` logs a copy of an FX graph through
``torch._dynamo.utils.lazy_format_graph_code``, which depyf turns into a file
``__compiled_fn_<n>.<name>.<i>.py`` in the dump directory.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import warnings
from typing import Callable, Iterator

import torch
import torch.fx

logger = logging.getLogger(__name__)


def accepts_keywords(fn: Callable) -> bool:
    """Whether ``fn`` takes ``**kwargs``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


@contextlib.contextmanager
def keyword_tolerant_load_hook() -> Iterator[None]:
    """Inside ``depyf.prepare_debug``: let depyf's ``load_by_key_path`` hook take extra keywords."""
    from depyf.explain.global_variables import data
    from torch._inductor.codecache import PyCodeCache

    hook = PyCodeCache.__dict__.get("load_by_key_path")
    if not callable(hook) or isinstance(hook, classmethod) or accepts_keywords(hook):
        yield  # not patched by depyf, or the hook already takes keywords
        return

    def load_by_key_path(key, path, linemap=None, attrs=None, **extra):
        if not extra:
            return hook(key, path, linemap, attrs)
        original = data["unpatched_load_by_key_path"]
        data["unpatched_load_by_key_path"] = functools.partial(original, **extra)
        try:
            return hook(key, path, linemap, attrs)
        finally:
            data["unpatched_load_by_key_path"] = original

    PyCodeCache.load_by_key_path = load_by_key_path
    try:
        yield
    finally:
        PyCodeCache.load_by_key_path = hook


@contextlib.contextmanager
def depyf_debug(dump_dir: str) -> Iterator[None]:
    """``depyf.prepare_debug(dump_dir)`` that works with newer Inductor's loader keywords."""
    import depyf

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*You are trying to debug `torch.compile`.*")
        with depyf.prepare_debug(dump_dir), keyword_tolerant_load_hook():
            yield


def copy_graph_module(graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A ``GraphModule`` over a copy of ``graph`` (the original stays untouched)."""
    copied = torch.fx.Graph()
    output = copied.graph_copy(graph, {})
    copied.output(output)
    root = graph.owning_module if graph.owning_module is not None else torch.nn.Module()
    return torch.fx.GraphModule(root, copied)


def log_graph(name: str, graph: torch.fx.Graph) -> None:
    """Log ``graph`` under ``name`` the way Inductor logs its graphs (depyf dumps it)."""
    from torch._dynamo.utils import lazy_format_graph_code

    logger.debug("%s", lazy_format_graph_code(name, copy_graph_module(graph)))
