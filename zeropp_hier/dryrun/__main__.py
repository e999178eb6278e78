"""``python -m zeropp_hier.dryrun --nodes N [--rank R] script.py [args]`` (dryrun/script.py)."""

import sys

from .script import main

sys.exit(main())
