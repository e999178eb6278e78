"""The attributes DeepSpeed's ZeRO-3 puts on every parameter, as types for mypy.

DeepSpeed 0.19 sets them on plain ``torch.nn.Parameter`` objects (``Init._convert_to_deepspeed_param``
and ``Init._partition_param`` in ``deepspeed/runtime/zero/partition_parameters.py``) and ships no
type information. The adapter annotates the parameters DeepSpeed hands it with ``ZeroParam``, so
that a misspelt or missing attribute is a type error. Neither class is ever instantiated or
checked at run time: they only name what DeepSpeed has set by the time our hooks see a parameter.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class ZeroPartition(torch.Tensor):
    """``param.ds_tensor``: this rank's partition of the flattened parameter."""

    ds_numel: int  # elements of the partition (the last rank's may be padding)


class ZeroParam(torch.nn.Parameter):
    """A parameter converted by ``deepspeed.zero.Init`` (and partitioned: ``ds_tensor`` set)."""

    ds_id: int  # unique per process, in creation order: the same on every rank
    ds_status: Any  # a deepspeed ZeroParamStatus (DeepSpeed has no type information)
    ds_shape: torch.Size  # the full parameter's shape
    ds_numel: int  # the full parameter's elements
    ds_tensor: ZeroPartition
    ds_persist: bool  # small parameters DeepSpeed keeps gathered for the whole step
    ds_summary: Callable[[], dict]
    ds_zero_partition_world_size: int  # ranks the parameter is partitioned over
    ds_secondary_tensor: torch.Tensor | None  # DeepSpeed's hpZ copy (None: no hpZ)
    # DeepSpeed's per-parameter closures; ``partition.bind`` rebinds them to the hierarchy
    all_gather: Callable[..., Any]
    all_gather_coalesced: Callable[..., Any]
    partition: Callable[..., Any]
