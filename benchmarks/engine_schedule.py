"""The side-by-side schedule of ``benchmarks/bench_engine.py --side-by-side``.

Every engine starts at once, each in its own process (their starts, mostly compilation and
CUDA-graph capture, overlap); once all are up, each cell runs on every engine in turn
before the next cell starts, the engines' order rotated by one per cell. So the settings
of a ratio are timed seconds apart on the same GPU, and a sweep cut short by its time limit
has run the same cells on every engine. Only one engine works at a time: the others wait
on their stdin, idle.

An engine process speaks JSON lines (``bench_engine.serve_worker``): it prints
``{"ready": engine}`` once up, answers each ``{"cell": [T, batch, context, repeat]}`` with
``{"cell": record}`` or ``{"error": text}``, and ``{"quit": true}`` with ``{"done": engine}``.
No vLLM here: the schedule is tested with a stand-in engine process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

Cell = tuple  # (temperature, batch, context, repeat)


class EngineProcess:
    """One engine process: JSON-line requests on its stdin, replies on its stdout, its
    own output (stderr) in ``log_path``."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: Path):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
            text=True,
            bufsize=1,
        )
        self._buffer = ""
        self.closed = False  # its stdout ended: the process exited (or is exiting)

    def read(self, timeout: float) -> Optional[dict]:
        """The next reply, or None when the process ended or ``timeout`` s passed."""
        deadline = time.monotonic() + max(timeout, 0.0)
        fd = self.proc.stdout.fileno()
        while "\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16).decode()
            if not chunk:
                self.closed = True
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split("\n", 1)
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return {"error": f"unreadable reply {line[:200]!r}"}

    def send(self, message: dict) -> bool:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def stop(self, timeout: float = 30.0) -> Optional[dict]:
        """Ask it to quit; returns its ``done`` record (None if it gave none), then makes
        sure its process group is gone."""
        done = None
        if self.proc.poll() is None and self.send({"quit": True}):
            reply = self.read(timeout)
            done = reply.get("done") if reply else None
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        self._log.close()
        return done

    def kill(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=20)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]


@dataclasses.dataclass
class SideBySide:
    """What a side-by-side run produced: per engine name its record (from ``ready``,
    updated by ``done``), every cell record, and notes (engines that failed, cells not
    run)."""

    engines: dict = dataclasses.field(default_factory=dict)
    cells: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)


def rotated(names: list[str], index: int) -> list[str]:
    """``names`` rotated left by ``index`` (the engines' order for the index-th cell)."""
    if not names:
        return []
    k = index % len(names)
    return names[k:] + names[:k]


def round_estimate(durations: dict, cell: Cell) -> float:
    """Seconds a round of ``cell`` is expected to take: the longest round seen at the
    same batch and context, else at the same batch, else 0 (nothing known yet)."""
    _, batch, context, _ = cell
    same = durations.get((batch, context))
    if same:
        return max(same)
    seen = [d for (b, _), ds in durations.items() if b == batch for d in ds]
    return max(seen, default=0.0)


def run_side_by_side(
    commands: dict[str, tuple[list[str], dict]],
    cells: list[Cell],
    workdir: Path,
    start_deadline: float,
    deadline: float,
    reply_timeout: float,
    log: Callable[[str], None] = print,
    on_progress: Optional[Callable[[SideBySide], None]] = None,
) -> SideBySide:
    """Start every engine of ``commands`` (name -> (argv, env)) at once; once all are up
    (or ``start_deadline``, a ``time.time()`` value, passed: the late ones are stopped),
    run each of ``cells`` on every live engine in turn. A round that would end past
    ``deadline`` (by :func:`round_estimate`) is skipped; an engine that does not answer
    within ``reply_timeout`` s is stopped and noted. ``on_progress`` sees the partial
    result after every round."""
    out = SideBySide()
    procs = {
        name: EngineProcess(name, argv, env, workdir / f"{name}.log")
        for name, (argv, env) in commands.items()
    }
    live: list[str] = []
    try:
        for name, proc in procs.items():
            reply = proc.read(start_deadline - time.time())
            if reply and "ready" in reply:
                out.engines[name] = reply["ready"]
                live.append(name)
                log(f"{name}: up ({reply['ready'].get('init_s', 0):.0f} s to start)")
            else:
                if proc.closed:
                    try:
                        why = f"exited ({proc.proc.wait(timeout=10)})"
                    except subprocess.TimeoutExpired:
                        why = "closed its output"
                else:
                    why = "did not start in time"
                out.notes.append(f"{name}: {why} (log {proc.log_path})")
                log(f"{name}: {why}; its log ends:\n{proc.log_tail()}")
                proc.kill()
        durations: dict = {}
        skipped: list[Cell] = []
        for index, cell in enumerate(cells):
            if not live:
                break
            if time.time() + round_estimate(durations, cell) > deadline:
                skipped.append(cell)
                continue
            t0 = time.time()
            for name in rotated(live, index):
                proc = procs[name]
                sent = proc.send({"cell": list(cell)})
                reply = proc.read(reply_timeout) if sent else None
                if reply is None:
                    out.notes.append(f"{name}: no answer to cell {list(cell)}; stopped")
                    log(f"{name}: no answer to cell {list(cell)}; its log ends:\n{proc.log_tail()}")
                    proc.kill()
                    live.remove(name)
                elif "cell" in reply:
                    out.cells.append(reply["cell"])
                else:
                    out.notes.append(f"{name}: cell {list(cell)} failed: {reply.get('error')}")
                    log(out.notes[-1])
            durations.setdefault((cell[1], cell[2]), []).append(time.time() - t0)
            if on_progress:
                on_progress(out)
        if skipped:
            out.notes.append(
                f"not run (time): {len(skipped)} of {len(cells)} cells "
                "(temperature, batch, context, repeat): " + ", ".join(map(str, skipped))
            )
    finally:
        for name, proc in procs.items():
            if name in live:
                done = proc.stop()
                if done:
                    out.engines[name] = {**out.engines.get(name, {}), **done}
            else:
                proc.kill()
    return out
