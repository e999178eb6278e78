"""The file ``zeropp-hier probe --out`` writes, read back for ``plan --probe`` and for
``"preset": "auto"`` (``auto.probe_file``). Pure: text in, link rates or a named problem out."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from ..core.vocab import TIERS

FIX = "give the JSON file written by `zeropp-hier probe --out` (or measure again)"


class ProbeFileError(ValueError):
    """The probe file's content is unusable; the message says what is wrong."""


def parse_probe(data: str | bytes) -> dict[str, tuple[float, float]]:
    """{tier: (bandwidth bytes/s per GCD, latency s)} from a probe file's content. A tier's
    bandwidth may be infinite (the probe writes that for a link too fast to measure); it must be
    positive and not NaN; a latency is a finite number >= 0."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        probe = json.loads(text)
    except UnicodeDecodeError:
        raise ProbeFileError("it is not UTF-8 text") from None
    except ValueError as e:
        raise ProbeFileError(f"it is not valid JSON ({e})") from None
    tiers = probe.get("tiers") if isinstance(probe, Mapping) else None
    if not isinstance(tiers, Mapping) or not tiers:
        raise ProbeFileError('it has no "tiers" object')
    out = {}
    for tier, v in tiers.items():
        if tier not in TIERS:
            raise ProbeFileError(f"unknown tier {tier!r} (tiers are {list(TIERS)})")
        if not isinstance(v, Mapping):
            raise ProbeFileError(f"tier {tier!r} is not an object")
        bw: Any = v.get("bandwidth")  # JSON values: checked below
        lat: Any = v.get("latency")
        if not _number(bw) or math.isnan(bw) or bw <= 0:
            raise ProbeFileError(f"tier {tier!r} has bandwidth {bw!r}; it must be a positive number of bytes/s")
        if not _number(lat) or not math.isfinite(lat) or lat < 0:
            raise ProbeFileError(f"tier {tier!r} has latency {lat!r}; it must be a finite number of seconds >= 0")
        out[tier] = (float(bw), float(lat))
    return out


def read_probe(path: str) -> dict[str, tuple[float, float]]:
    """``parse_probe`` of the file at ``path``; ``ProbeFileError`` (naming the problem) also
    when it cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ProbeFileError("no such file") from None
    except IsADirectoryError:
        raise ProbeFileError("it is a directory") from None
    except OSError as e:
        raise ProbeFileError(f"it cannot be read ({e.strerror or e})") from None
    return parse_probe(data)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
