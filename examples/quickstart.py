"""Quickstart: window a draft model's attention with one line.

    python examples/quickstart.py [--contexts 1024 4096 16384] [--window 512]

Builds the reference DFlash-style draft (random weights, paged KV cache),
compiles it with ``backend="dspark"`` with and without the window, and prints
agreement with eager references plus the time per draft step (``dspark-compile
demo``); then decodes the committed trained pair with the speculative loop without
and with the window and prints the acceptance both ways (``--skip-pair`` skips it).
Same as ``python -m dspark_research demo`` (``dspark_research/cli.py``).
"""

import sys
from pathlib import Path

# The acceptance part is research code: it lives in the checkout (dspark_research/),
# not in the installed wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark_research.cli import main as research_main  # noqa: E402


def main(argv=None) -> int:
    return research_main(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
