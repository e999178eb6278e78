"""Side effects of package detection that read the node itself (not rocm-smi): the XGMI link
counts the amdgpu driver shows in sysfs ([Note: packages from XGMI link counts] in
``xgmi_links``). ``probe.detect`` passes the text to ``autodetect.local_record``."""

from __future__ import annotations

import re
from pathlib import Path

DRM = Path("/sys/class/drm")
_CARD = re.compile(r"^card(\d+)$")


def read_xgmi_num_links(drm: Path = DRM) -> str | None:
    """``cardN/device/xgmi_num_links`` of every card that has one, one line each in card order;
    None when no card shows the file (no XGMI hive, an older driver, or not Linux)."""
    cards = []
    try:
        for p in drm.iterdir():
            m = _CARD.match(p.name)
            if m and (p / "device" / "xgmi_num_links").is_file():
                cards.append((int(m.group(1)), p / "device" / "xgmi_num_links"))
    except OSError:
        return None
    if not cards:
        return None
    lines = []
    for _, f in sorted(cards):
        try:
            lines.append(f.read_text().strip())
        except OSError:
            return None
    return "\n".join(lines) + "\n"
