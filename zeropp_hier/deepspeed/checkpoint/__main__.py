"""``python -m zeropp_hier.deepspeed.checkpoint``: the checkpoint tool (``atomic.main``), as
``zeropp-hier checkpoint`` runs it."""

from .atomic import main

raise SystemExit(main())
