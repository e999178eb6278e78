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

from ..comm import _coordinator as coordinator
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


def _build(parts: list, gcds_per_gpu: int | None, gpus_per_node: int | None) -> Detected | HierTopologyError:
    """Rank 0: every rank's record (as sent) -> the topology, or the error every rank raises."""
    for r, got in enumerate(parts):
        if got[0] == "error":
            _, field, value, fix = got
            return HierTopologyError(field, value, f"{fix} (reported by rank {r})")
    try:
        return build_topology([RankRecord(*got[1:]) for got in parts], gcds_per_gpu, gpus_per_node)
    except HierTopologyError as e:
        return e


def detect(gcds_per_gpu: int | None, gpus_per_node: int | None) -> Detected:
    """Collective: every rank of the default group must call it."""
    rank = dist.get_rank()
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
    # each record to rank 0 only (a few hundred bytes per rank), rank 0 builds the topology and
    # sends it, or the first error, to every rank: no rank but rank 0 holds every rank's record
    # ([Note: a coordinator, not a world gather] in comm/_coordinator.py)
    mine = ["error", rec.field, rec.value, rec.fix] if isinstance(rec, HierTopologyError) else ["ok", *rec]
    parts = coordinator.gather_to_root(mine)
    result: list = [None]
    if parts is not None:
        result[0] = _build(parts, gcds_per_gpu, gpus_per_node)
    dist.broadcast_object_list(result, src=0)
    detected = result[0]
    if isinstance(detected, HierTopologyError):
        raise detected
    if rank == 0:  # the detection report, once (the job prints rank 0's INFO log)
        logger.info(detected.describe())
    return detected
