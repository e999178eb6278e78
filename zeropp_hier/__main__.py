"""``python -m zeropp_hier`` = the ``zeropp-hier`` command (zeropp_hier.tools.command)."""

import sys

from zeropp_hier.tools.command import main

if __name__ == "__main__":
    sys.exit(main())
