"""Side effects of ``"topology": "auto"``: read this process's surroundings (environment, host
name, visible GPUs, ``rocm-smi --showtopo``), exchange them across ranks, and hand the list to
the pure ``autodetect.build_topology``.

A rank that cannot describe itself does not raise before the exchange: the others would wait in
the collective forever. It sends its error instead, and every rank raises the same error after
the exchange.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess

import torch
import torch.distributed as dist

from ..core.errors import HierTopologyError
from .autodetect import Detected, RankRecord, build_topology, local_record
from .node_read import read_xgmi_num_links

logger = logging.getLogger("zeropp_hier")
ROCM_SMI_TIMEOUT_S = 60


def _showtopo() -> str | None:
    exe = shutil.which("rocm-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--showtopo"], capture_output=True, text=True, timeout=ROCM_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HierTopologyError(
            "rocm-smi --showtopo",
            f"no answer in {ROCM_SMI_TIMEOUT_S} s",
            "check the GPU driver, or give the topology explicitly",
        ) from None
    if out.returncode != 0:
        raise HierTopologyError(
            "rocm-smi --showtopo",
            out.stderr.strip()[-300:],
            "rocm-smi failed; check the GPU driver, or give the topology explicitly",
        )
    return out.stdout


def detect(gcds_per_gpu: int | None, gpus_per_node: int | None) -> Detected:
    """Collective: every rank of the default group must call it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rec: RankRecord | HierTopologyError
    try:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        rec = local_record(
            rank,
            os.environ,
            socket.gethostname(),
            gpus,
            _showtopo() if gpus else None,
            read_xgmi_num_links() if gpus else None,
        )
    except HierTopologyError as e:
        rec = e
    except Exception as e:  # noqa: BLE001 - sent, not raised alone ([Note: agreed local checks])
        rec = HierTopologyError("topology auto", f"{type(e).__name__}: {e}", "this rank could not describe itself")
    records: list = [None] * world
    dist.all_gather_object(records, rec)
    for r, got in enumerate(records):
        if isinstance(got, HierTopologyError):
            raise HierTopologyError(got.field, got.value, f"{got.fix} (reported by rank {r})")
    detected = build_topology(records, gcds_per_gpu, gpus_per_node)
    if rank == 0:
        logger.info(detected.describe())
    return detected
