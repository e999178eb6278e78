"""The user's DeepSpeed keys in the job's config: a JSON file (``deepspeed_config=path.json``) and
single keys (``+deepspeed.KEY=value``, nested keys dotted), merged into the config the job builds
(``JobSpec.ds_config``).

A key the user sets wins, except the keys the job must own, which are refused when they disagree
(``HierConfigError`` naming the field, their value, ours and the fix):

- ``train_micro_batch_size_per_gpu`` / ``gradient_accumulation_steps``: the job's ``data.micro_batch``
  and ``grad_accum`` size its batches, its data position and its checkpoints;
- ``train_batch_size``: must be micro-batch x accumulation x world (checked once the world is known);
- ``zero_optimization.stage``: the engine is a ZeRO-3 stage;
- ``bf16`` / ``fp16`` ``enabled``: the job's ``dtype`` (the memory check and the model build use it);
- the ``zeropp_hier`` section's ``preset``, ``compression``, ``topology`` (and ``enabled``): the
  job's groups of those names.

The value ``"auto"`` (Hugging Face's DeepSpeed configs use it for the batch keys) means "the job's".
Keys starting with ``_`` (e.g. ``"_source"``, where a file names its origin) are dropped.

Pure, but for reading the file.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Mapping

from ..core.errors import HierConfigError

# the job's fix for each batch key that disagrees
_BATCH_FIX = {
    "train_micro_batch_size_per_gpu": "drop the key, or set data.micro_batch={theirs} on the command line",
    "gradient_accumulation_steps": "drop the key, or set grad_accum={theirs} on the command line",
}
_BATCH_KEYS = ("train_batch_size", *_BATCH_FIX)
_SECTION_KEYS = {"preset": "preset=", "compression": "compression=", "topology": "topology=", "enabled": "preset="}


def load(path: str) -> dict:
    """The user's DeepSpeed JSON (a dict); a missing or malformed file names itself."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise HierConfigError("deepspeed_config", path, "no such file: give the path of a DeepSpeed JSON") from None
    except json.JSONDecodeError as e:
        raise HierConfigError("deepspeed_config", path, f"not JSON ({e}): give a DeepSpeed JSON file") from None
    if not isinstance(data, dict):
        raise HierConfigError("deepspeed_config", path, "the file must hold one JSON object (DeepSpeed's config)")
    return data


def _strip(d: Mapping[str, Any]) -> dict:
    return {k: _strip(v) if isinstance(v, Mapping) else v for k, v in d.items() if not str(k).startswith("_")}


def deep_merge(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict:
    """``ours`` with ``theirs`` merged in: nested dicts key by key, any other value replaced."""
    out = copy.deepcopy(dict(ours))
    for k, v in theirs.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _refuse(field: str, theirs: object, ours: object, fix: str, where: str) -> HierConfigError:
    return HierConfigError(field, theirs, f"{where} sets {theirs!r} but the job's value is {ours!r}: {fix}")


def check_owned(job: Mapping[str, Any], user: Mapping[str, Any], where: str, world: int | None) -> None:
    """Refuse a key of ``user`` that the job owns (module docstring) and that disagrees with ``job``."""
    micro, accum = job["train_micro_batch_size_per_gpu"], job["gradient_accumulation_steps"]
    for key, fix in _BATCH_FIX.items():
        theirs = user.get(key, "auto")
        if theirs != "auto" and theirs != job[key]:
            raise _refuse(f"deepspeed.{key}", theirs, job[key], fix.format(ours=job[key], theirs=theirs), where)
    tbs = user.get("train_batch_size", "auto")
    if tbs != "auto" and world is not None and tbs != micro * accum * world:
        raise _refuse(
            "deepspeed.train_batch_size",
            tbs,
            micro * accum * world,
            f"the job's is micro_batch {micro} x grad_accum {accum} x {world} ranks; drop the key, or choose "
            "data.micro_batch and grad_accum whose product with the ranks is your batch",
            where,
        )
    zero = user.get("zero_optimization") or {}
    if "stage" in zero and zero["stage"] != 3:
        raise _refuse(
            "deepspeed.zero_optimization.stage",
            zero["stage"],
            3,
            "the engine is a ZeRO-3 stage; drop the key (stock ZeRO-3 without our section is preset=stock)",
            where,
        )
    for dtype in ("bf16", "fp16"):
        sec = user.get(dtype)
        if isinstance(sec, Mapping) and "enabled" in sec:
            ours_on = bool(job.get(dtype, {}).get("enabled", False))
            if bool(sec["enabled"]) != ours_on:
                ours_dtype = next((d for d in ("bf16", "fp16") if job.get(d, {}).get("enabled")), "fp32")
                raise _refuse(
                    f"deepspeed.{dtype}.enabled",
                    sec["enabled"],
                    ours_on,
                    f"the job trains in dtype={ours_dtype}; set dtype= on the command line "
                    "(the memory check and the model build read it) and drop the key",
                    where,
                )
    section = user.get("zeropp_hier")
    if isinstance(section, Mapping):
        ours_sec = job.get("zeropp_hier")
        for key, option in _SECTION_KEYS.items():
            if key not in section:
                continue
            if ours_sec is None:  # preset=stock: the job builds no section
                raise _refuse(
                    f"deepspeed.zeropp_hier.{key}",
                    section[key],
                    None,
                    "the job runs preset=stock (no zeropp_hier section); choose a preset on the command line",
                    where,
                )
            ours = ours_sec.get(key, None if key != "enabled" else True)
            if section[key] != ours and not (key == "compression" and ours is None and section[key] is None):
                raise _refuse(
                    f"deepspeed.zeropp_hier.{key}",
                    section[key],
                    ours,
                    f"the job's {key} comes from its {option} option; set it there and drop the key",
                    where,
                )


def merge_user(job: dict, path: str | None, keys: Mapping[str, Any] | None, world: int | None = None) -> dict:
    """``job`` with the user's file (``path``) and then the user's single ``keys`` merged in, each
    checked against the keys the job owns. ``world`` None: ``train_batch_size`` is checked later,
    once the ranks are known."""
    out = job
    for user, where in ((load(path) if path else None, f"deepspeed_config {path}"), (keys, "+deepspeed")):
        if not user:
            continue
        user = _strip(user)
        check_owned(job, user, where, world)
        # "auto" batch keys are the job's (DeepSpeed itself would refuse the string)
        user = {k: v for k, v in user.items() if not (k in _BATCH_KEYS and v == "auto")}
        out = deep_merge(out, user)
    return out
