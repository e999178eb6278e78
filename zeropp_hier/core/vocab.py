"""The package's vocabulary: the presets, the tiers and the axes, each named once here and imported
everywhere else. Each is a ``Literal`` type (what mypy checks) and the tuple of its values read
from the type (what the parsers check at run time), so that the two cannot drift.

Tiers and axes are the same three words, the levels of the hierarchy: a GCD (one die of a
MI250X), a GPU package (two GCDs), a node. The one stated order is ``TIERS``, fastest link
first; ``AXES`` is the same words slowest first, the order of a rank's coordinate
(node, gpu, gcd) and of every layout (``core/topology.py``).
"""

from __future__ import annotations

from typing import Literal, get_args

Tier = Literal["gcd", "gpu", "node"]
TIERS: tuple[Tier, ...] = get_args(Tier)  # fastest link first
AXES: tuple[Tier, ...] = tuple(reversed(TIERS))  # slowest link first: a rank's coordinate order

# a preset that names its compression; "auto" chooses among these ([Note: auto preset] in
# deepspeed/auto.py)
FixedPreset = Literal["zero3", "zeropp", "frontier"]
FIXED_PRESETS: tuple[FixedPreset, ...] = get_args(FixedPreset)
# the "preset" of the zeropp_hier section
Preset = Literal[FixedPreset, "auto"]
PRESETS: tuple[Preset, ...] = get_args(Preset)
