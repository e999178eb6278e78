"""The user's DeepSpeed keys in the job's config: a JSON file (``deepspeed_config=path.json``) and
single keys (``+deepspeed.KEY=value``, nested keys dotted), merged into the config the job builds
(``JobSpec.ds_config``), read as DeepSpeed and Hugging Face read a DeepSpeed JSON.

[Note: a user's DeepSpeed JSON]
- ``optimizer`` and ``scheduler`` are whole sections: DeepSpeed builds the optimizer or scheduler
  named by ``type`` from exactly the ``params`` given, so a file's section replaces the job's
  whole (the recipe's stays only where the file gives none). A single key merges into the section
  it names, unless it changes its ``type`` (then it starts the section anew). Merged key by key,
  a recipe's ``WarmupCosineLR`` parameters would reach a user's ``WarmupLR`` (a ``TypeError`` on
  every rank).
- ``"auto"`` is filled where Hugging Face's Trainer fills it
  (``transformers/integrations/deepspeed.py``, ``HfTrainerDeepSpeedConfig.trainer_config_process``
  and ``trainer_config_finalize``; ``AUTO_KEYS``), from the job's own values: the batch keys, the
  clipping, Adam's lr, betas, eps and weight decay, the warm-up scheduler's lr range and step
  counts, bf16/fp16 ``enabled`` from ``dtype``, and the three bucket sizes from the model's hidden
  size (hidden², 0.9 hidden², 10 hidden, as HF derives them). An ``"auto"`` anywhere else is
  refused: HF's Trainer would pass it on and DeepSpeed would fail on the string.
- The keys the job owns are refused when they disagree (``HierConfigError`` naming the key, their
  value, the job's and the fix; ``check_owned``), as HF's Trainer refuses a value that disagrees
  with its arguments: the batch keys (the job's micro-batch and accumulation size its data
  position and checkpoints), ``zero_optimization.stage`` (3), ``bf16``/``fp16`` ``enabled`` (the
  job's ``dtype``: the memory check and the model build read it), and the ``zeropp_hier``
  section's ``preset``, ``compression``, ``topology``, ``enabled`` (the job's groups of those
  names; a value that parses to the job's own is agreement).
- Every other key passes to DeepSpeed as given (it validates its own config and refuses a key it
  does not know); keys starting with ``_`` (e.g. ``"_source"``) are dropped. ``notes`` lists what
  was replaced, filled and passed, for rank 0 to print.

Pure, but for reading the file.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Mapping

from ..core.errors import HierConfigError

WHOLE_SECTIONS = ("optimizer", "scheduler")
# every key HF's Trainer fills when it is "auto" (dotted, as its fill_match / fill_only name them)
AUTO_KEYS = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "fp16.enabled",
    "bf16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)
_BATCH_FIX = {
    "train_micro_batch_size_per_gpu": "drop the key, or set data.micro_batch={theirs} on the command line",
    "gradient_accumulation_steps": (
        "drop the key (the job derives it from global_batch, or takes grad_accum), or set "
        "grad_accum={theirs} on the command line (with global_batch=null where a recipe sets a global batch)"
    ),
}
_SECTION_KEYS = {"preset": "preset=", "compression": "compression=", "topology": "topology=", "enabled": "preset="}


@dataclass(frozen=True)
class JobValues:
    """The job's values that fill ``"auto"`` beyond its own DeepSpeed config (``JobSpec.auto_values``);
    None: not known here, so an ``"auto"`` that needs it is refused."""

    lr: float | None = None
    betas: tuple[float, float] | None = None
    eps: float | None = None
    weight_decay: float | None = None
    clip: float = 0.0
    warmup_steps: int = 0
    total_steps: int | None = None
    hidden: int | None = None


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


def _replaces(mine: Any, theirs: Any, whole: bool) -> bool:
    """Whether the user's optimizer/scheduler section ``theirs`` replaces the job's ``mine`` whole."""
    if not isinstance(theirs, Mapping):
        return False
    return whole or not isinstance(mine, dict) or theirs.get("type", mine.get("type")) != mine.get("type")


def merge_sections(ours: Mapping[str, Any], theirs: Mapping[str, Any], whole: bool) -> dict:
    """``deep_merge``, but ``optimizer`` and ``scheduler`` of ``theirs`` replace ours whole when
    ``whole`` (a file: a complete DeepSpeed config) or when they name another ``type`` (single keys)."""
    out = copy.deepcopy(dict(ours))
    for k, v in theirs.items():
        if k in WHOLE_SECTIONS and _replaces(out.get(k), v, whole):
            out[k] = copy.deepcopy(dict(v))
        else:
            out = deep_merge(out, {k: v})
    return out


def auto_table(job: Mapping[str, Any], values: JobValues, world: int | None) -> dict[str, Any]:
    """{dotted key: the job's value} for each of ``AUTO_KEYS`` the job can fill (pure)."""
    micro, accum = job["train_micro_batch_size_per_gpu"], job["gradient_accumulation_steps"]
    h = values.hidden
    table: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": None if world is None else micro * accum * world,
        "gradient_clipping": float(values.clip),
        "optimizer.params.lr": values.lr,
        "optimizer.params.betas": None if values.betas is None else list(values.betas),
        "optimizer.params.eps": values.eps,
        "optimizer.params.weight_decay": values.weight_decay,
        "scheduler.params.warmup_min_lr": 0.0,  # HF's fill_only: not a Trainer argument
        "scheduler.params.warmup_max_lr": values.lr,
        # DeepSpeed >= 0.19.6 refuses 0 warm-up steps (HF fills at least 1 too)
        "scheduler.params.warmup_num_steps": max(1, values.warmup_steps),
        "scheduler.params.total_num_steps": values.total_steps,
        "fp16.enabled": bool((job.get("fp16") or {}).get("enabled", False)),
        "bf16.enabled": bool((job.get("bf16") or {}).get("enabled", False)),
        "zero_optimization.reduce_bucket_size": None if h is None else h * h,
        "zero_optimization.stage3_prefetch_bucket_size": None if h is None else int(0.9 * h * h),
        "zero_optimization.stage3_param_persistence_threshold": None if h is None else 10 * h,
    }
    return table


def resolve_auto(user: Mapping[str, Any], table: Mapping[str, Any], where: str, notes: list[str]) -> dict:
    """``user`` with each ``"auto"`` replaced by the job's value from ``table``; an ``"auto"`` the
    job cannot fill is refused naming the key. ``train_batch_size`` "auto" before the ranks are
    known is dropped (DeepSpeed computes it; checked once the world is known)."""
    filled: list[str] = []

    def walk(d: Mapping[str, Any], prefix: str) -> dict:
        out: dict[str, Any] = {}
        for k, v in d.items():
            key = f"{prefix}{k}"
            if key == "zeropp_hier":  # our own section: its "auto"s are its own (e.g. topology mode)
                out[k] = v
            elif isinstance(v, Mapping):
                out[k] = walk(v, key + ".")
            elif isinstance(v, str) and v == "auto":
                if key == "train_batch_size" and table.get(key) is None:
                    continue
                if table.get(key) is None:
                    raise HierConfigError(
                        f"deepspeed.{key}",
                        "auto",
                        f"{where} sets 'auto' but the job has no value for it: the job fills 'auto' only where "
                        f"Hugging Face's Trainer does ({', '.join(AUTO_KEYS)}); give a value",
                    )
                out[k] = table[key]
                filled.append(f"{key}={table[key]!r}")
            else:
                out[k] = v
        return out

    resolved = walk(user, "")
    if filled:
        notes.append(f"{where}: 'auto' filled from the job: {', '.join(filled)}")
    return resolved


def _refuse(field: str, theirs: object, ours: object, fix: str, where: str) -> HierConfigError:
    return HierConfigError(field, theirs, f"{where} sets {theirs!r} but the job's value is {ours!r}: {fix}")


def _section_agrees(ours_sec: Mapping[str, Any], key: str, theirs: Any) -> bool:
    """Whether the user's ``zeropp_hier.<key>`` says what the job's section says: equal, or parsed
    to the same configuration (e.g. a compression spelled out that is the preset's own), or, for
    the topology, auto with the sizes auto detection is then checked against."""
    ours = ours_sec.get(key, None if key != "enabled" else True)
    if theirs == ours:
        return True
    if key == "enabled":
        return False
    from ..core.config import parse_section

    try:
        a, b = parse_section(dict(ours_sec)), parse_section({**ours_sec, key: theirs})
    except HierConfigError:
        return False
    if key == "topology":
        return a.topology == b.topology or (a.topology.mode == "auto" and b.topology.mode == "auto")
    return a.compression == b.compression if key == "compression" else a.preset == b.preset


def check_owned(job: Mapping[str, Any], user: Mapping[str, Any], where: str, world: int | None) -> None:
    """Refuse a key of ``user`` that the job owns (module docstring) and that disagrees with ``job``.
    ``"auto"`` is the job's value."""
    micro, accum = job["train_micro_batch_size_per_gpu"], job["gradient_accumulation_steps"]
    for key, fix in _BATCH_FIX.items():
        theirs = user.get(key, "auto")
        if theirs != "auto" and theirs != job[key]:
            raise _refuse(f"deepspeed.{key}", theirs, job[key], fix.format(theirs=theirs), where)
    tbs = user.get("train_batch_size", "auto")
    if tbs != "auto" and world is not None and tbs != micro * accum * world:
        raise _refuse(
            "deepspeed.train_batch_size",
            tbs,
            micro * accum * world,
            f"the job's is micro_batch {micro} x accumulation {accum} x {world} ranks; drop the key, or give "
            "global_batch= (sequences per step) on the command line",
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
        if isinstance(sec, Mapping) and "enabled" in sec and sec["enabled"] != "auto":
            ours_on = bool(job.get(dtype, {}).get("enabled", False))
            if bool(sec["enabled"]) != ours_on:
                ours_dtype = next((d for d in ("bf16", "fp16") if job.get(d, {}).get("enabled")), "fp32")
                raise _refuse(
                    f"deepspeed.{dtype}.enabled",
                    sec["enabled"],
                    ours_on,
                    f"the job trains in dtype={ours_dtype}; set dtype= on the command line "
                    '(the memory check and the model build read it) and drop the key, or give "auto"',
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
            if not _section_agrees(ours_sec, key, section[key]):
                raise _refuse(
                    f"deepspeed.zeropp_hier.{key}",
                    section[key],
                    ours_sec.get(key, None if key != "enabled" else True),
                    f"the job's {key} comes from its {option} option; set it there and drop the key",
                    where,
                )


def _passed(user: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The user's keys outside the two whole sections that were given a value (not "auto")."""
    out = []
    for k, v in user.items():
        if isinstance(v, Mapping) and k not in WHOLE_SECTIONS:
            out += _passed(v, f"{prefix}{k}.")
        elif k not in WHOLE_SECTIONS and not (isinstance(v, str) and v == "auto"):
            out.append(f"{prefix}{k}")
    return out


def merge_user(
    job: dict,
    path: str | None,
    keys: Mapping[str, Any] | None,
    world: int | None = None,
    values: JobValues | None = None,
    notes: list[str] | None = None,
) -> dict:
    """``job`` with the user's file (``path``) and then the user's single ``keys`` merged in
    ([Note: a user's DeepSpeed JSON]). ``world`` None: ``train_batch_size`` is checked later, once
    the ranks are known. ``values``: the job's values for ``"auto"`` (default: what ``job`` itself
    says: Adam's params and the clipping). ``notes``: gets one line per merge saying what was
    replaced whole, filled and passed."""
    notes = [] if notes is None else notes
    if values is None:
        params = (job.get("optimizer") or {}).get("params") or {}
        b = params.get("betas")
        values = JobValues(
            lr=params.get("lr"),
            betas=None if b is None else (b[0], b[1]),
            eps=params.get("eps"),
            weight_decay=params.get("weight_decay"),
            clip=job.get("gradient_clipping", 0.0),
        )
    table = auto_table(job, values, world)
    out = job
    for user, where, whole in (
        (load(path) if path else None, f"deepspeed_config {path}", True),
        (keys, "+deepspeed", False),
    ):
        if not user:
            continue
        given = _strip(user)
        user = resolve_auto(given, table, where, notes)
        check_owned(job, user, where, world)
        for k in WHOLE_SECTIONS:
            if _replaces(out.get(k), user.get(k), whole):
                had = (out.get(k) or {}).get("type")
                notes.append(
                    f"{where}: {k} {user[k].get('type')!r} replaces the job's {had!r} whole "
                    "(DeepSpeed builds it from exactly the params given)"
                )
        passed = _passed(given)
        if passed:
            notes.append(f"{where}: passed to DeepSpeed as given (it validates them): {', '.join(passed)}")
        out = merge_sections(out, user, whole)
    return out
