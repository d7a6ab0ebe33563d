"""The quickstart demo: window a reference DFlash draft with backend="dspark".

For each context length it compiles the built-in draft twice (window off, and
``draft_window_size=W``), checks both against eager references (full
attention, and attention masked to the window on the full block table), and
times one draft step of each.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Iterator, Optional, Sequence

import torch

from dspark_compile.backend import compile_caches_off
from dspark_compile.config import DraftWindowConfig
from dspark_compile.models import DFlashReferenceDraft, DraftModelConfig
from dspark_compile.passes import clear_pass_records, pass_records
from dspark_compile.testing import make_draft_case

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DemoRow:
    context_len: int
    windowed_max_err: float  # compiled windowed vs eager windowed reference
    full_max_err: float  # compiled full vs eager full reference
    window_effect: float  # max |windowed - full|: the window changes the output
    rewritten_calls: int
    window_computations: int
    full_ms: float
    windowed_ms: float

    @property
    def speedup(self) -> float:
        return self.full_ms / self.windowed_ms


def best_time_ms(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one warm-up call, in ms."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - begin)
    return best * 1e3


def run_demo(
    context_lens: Sequence[int] = (1024, 4096, 16384),
    window_size: int = 512,
    num_requests: int = 4,
    block_q_len: int = 8,
    block_size: int = 16,
    num_layers: int = 4,
    lowering: str = "inductor",
    device: str = "cpu",
    repeats: int = 3,
    seed: int = 0,
    sink_size: int = 0,
) -> Iterator[DemoRow]:
    """Yield one ``DemoRow`` per context length (DFlash blocks, non-causal).

    ``sink_size`` S: ``draft_sink_size`` of the windowed compile (its reference
    then keeps the first ``ceil(S / b)`` blocks visible too)."""
    cfg = DraftModelConfig(
        hidden_size=256,
        num_layers=num_layers,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=512,
        causal=False,
    )
    model = DFlashReferenceDraft(cfg, seed=seed).eval().to(device)
    window = DraftWindowConfig(
        draft_window_size=window_size, method="dflash", draft_sink_size=sink_size
    )
    gen = torch.Generator().manual_seed(seed)
    for context_len in context_lens:
        seq_lens = [context_len + block_q_len - 37 * i for i in range(num_requests)]
        case = make_draft_case(
            seq_lens,
            [block_q_len] * num_requests,
            block_size=block_size,
            device=device,
            model=model,
            generator=gen,
        )
        args = case.fresh_args

        def reference(window_size: Optional[int]) -> torch.Tensor:
            return case.run_reference(window_size, sink_size=sink_size if window_size else 0)[0]

        with torch.no_grad():
            want_full, want_windowed = reference(None), reference(window_size)
            torch._dynamo.reset()
            full = torch.compile(
                model, backend="dspark", dynamic=False, options={"lowering": lowering}
            )
            got_full = full(*args())
            clear_pass_records()
            windowed = torch.compile(
                model,
                backend="dspark",
                dynamic=False,
                options={"lowering": lowering, **window.as_dict()},
            )
            with compile_caches_off():  # the passes run (and report) on every demo run
                got_windowed = windowed(*args())
            stats = [r.stats for r in pass_records() if r.pass_name == "draft_window"]
            fixed_args = args()
            row = DemoRow(
                context_len=context_len,
                windowed_max_err=(got_windowed - want_windowed).abs().max().item(),
                full_max_err=(got_full - want_full).abs().max().item(),
                window_effect=(got_windowed - got_full).abs().max().item(),
                rewritten_calls=sum(s["rewritten"] for s in stats),
                window_computations=sum(s["window_computations"] for s in stats),
                full_ms=best_time_ms(lambda: full(*fixed_args), repeats),
                windowed_ms=best_time_ms(lambda: windowed(*fixed_args), repeats),
            )
        logger.info("demo row: %s", row)
        yield row
