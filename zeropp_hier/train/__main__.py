"""Alias kept for one release: ``python -m zeropp_hier.train`` = ``python -m zeropp_hier.app.train``."""

from zeropp_hier.app.train import main

main()
