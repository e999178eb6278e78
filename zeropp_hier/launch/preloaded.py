"""Imported by a preloading world's fork server, and only there ([Note: preloaded ranks]): the
ranks' modules (``world._PRELOAD``) imported at once with the collector off, then frozen
([Note: frozen start-up objects]), so that the ranks it forks start with them frozen and its own
exit, when the world's owner exits, does not walk them once more."""

from __future__ import annotations

from .world import _PRELOAD, import_frozen

import_frozen(_PRELOAD)
