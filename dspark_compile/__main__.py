"""``python -m dspark_compile``: the ``dspark-compile`` command line."""

import sys

from dspark_compile.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
