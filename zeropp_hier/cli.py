"""Alias kept for one release: ``python -m zeropp_hier.cli`` = ``python -m zeropp_hier.tools.cli``."""

import sys

from zeropp_hier.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
