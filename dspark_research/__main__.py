"""``python -m dspark_research`` (from the checkout root): the research commands."""

import sys

from dspark_research.cli import main

if __name__ == "__main__":
    sys.exit(main())
