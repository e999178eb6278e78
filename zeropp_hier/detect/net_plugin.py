"""Is the network plugin that NCCL/RCCL were told to use loadable? Asked before the default
process group is made, so that a missing plugin stops the job with a line naming the module.

[Note: the network plugin]
Over Slingshot, RCCL (and NCCL) reach the NICs only through a libfabric network plugin
(aws-ofi-rccl / aws-ofi-nccl; on Frontier OLCF's ``rccl-net-plugin`` module). Without it they
fall back to TCP sockets over the same NICs, silently and many times slower: a job that forgot
the module still trains, at a fraction of the speed. ``scripts/frontier/env.sh`` therefore sets
``NCCL_NET="AWS Libfabric"`` (the plugin's network name), which makes RCCL refuse to start rather
than fall back. RCCL's own refusal comes late (at the first communicator, inside a collective)
and names neither the module nor the variable; this check comes first and does.

The library is looked up as RCCL/NCCL do: ``NCCL_NET_PLUGIN`` as a file name or path when it
names a ``.so``; otherwise ``lib{rccl,nccl}-net-<value>.so``; unset, ``lib{rccl,nccl}-net.so``;
each through the dynamic loader's own search (``LD_LIBRARY_PATH``, the cache), by ``dlopen``.
"""

from __future__ import annotations

import ctypes
from typing import Mapping

# NCCL_NET values that name a transport built into NCCL/RCCL, not a plugin.
BUILT_IN = ("IB", "Socket")


def candidates(env: Mapping[str, str]) -> list[str]:
    """The library names RCCL/NCCL would try, in order."""
    value = env.get("NCCL_NET_PLUGIN", "")
    if value in ("none", "NONE"):  # plugins disabled
        return []
    if ".so" in value:
        return [value]
    if value:
        return [f"librccl-net-{value}.so", f"libnccl-net-{value}.so"]
    return ["librccl-net.so", "libnccl-net.so"]


def _loadable(name: str) -> str | None:
    """None when ``name`` loads; else the loader's reason."""
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        return str(exc)
    return None


def problem(env: Mapping[str, str], loadable=_loadable) -> str | None:
    """None when no plugin is required or the required one loads; else what is wrong and the
    fix (for an error at ``NCCL_NET``)."""
    net = env.get("NCCL_NET", "")
    if not net or net in BUILT_IN:
        return None
    tried = candidates(env)
    reasons = []
    for name in tried:
        why = loadable(name)
        if why is None:
            return None
        reasons.append(why)
    detail = "; ".join(reasons) if reasons else "NCCL_NET_PLUGIN disables plugins"
    return (
        f"that network is RCCL's plugin, and no plugin loads (tried {', '.join(tried) or 'nothing'}: {detail}). "
        "On Frontier load OLCF's module `rccl-net-plugin` after `rocm` (scripts/frontier/env.sh does), or "
        "point ZH_RCCL_PLUGIN / NCCL_NET_PLUGIN at your build's lib/librccl-net.so; unset NCCL_NET only to "
        "accept the much slower TCP sockets"
    )
