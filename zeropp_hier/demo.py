"""Alias kept for one release: ``python -m zeropp_hier.demo`` = ``python -m zeropp_hier.app.demo``."""

import sys

from zeropp_hier.app.demo import main

if __name__ == "__main__":
    sys.exit(main())
