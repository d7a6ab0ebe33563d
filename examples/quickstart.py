"""Quickstart: window a draft model's attention with one line.

    python examples/quickstart.py [--contexts 1024 4096 16384] [--window 512]

Builds the reference DFlash-style draft (random weights, paged KV cache),
compiles it with ``backend="dspark"`` with and without the window, and prints
agreement with eager references plus the time per draft step. Same as
``dspark-compile demo`` (``dspark_compile/tools/cli.py`` prints the table).
"""

import sys

from dspark_compile.tools.cli import main as cli_main


def main(argv=None) -> int:
    return cli_main(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
