"""``python -m benchmarks.compare``: the side-by-side benchmark, benchmarks/compare/run.py."""

import sys

from benchmarks.compare.run import main

sys.exit(main())
