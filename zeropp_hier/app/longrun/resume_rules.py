"""What a resume may change, as pure logic: the saved job's record against the job now asking to
continue it ([Note: resuming at another world size] in resume.py). No files, no torch.distributed.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

from ...core.errors import HierConfigError
from ..spec import JobSpec

Mode = Literal["native", "universal"]


def record(spec: JobSpec, world: int, accum: int, data_sha256: str | None) -> dict:
    """What the job writes beside its state at every save: the settings a resume is checked
    against (plain types only: the file loads tensors-only)."""
    return {
        "world": world,
        "micro_batch": spec.micro_batch,
        "accum": accum,
        "preset": spec.preset,
        "dtype": spec.dtype,
        "seed": spec.seed,
        "model": asdict(spec.model),
        "data_sha256": data_sha256,
    }


def _is_stock(preset: object) -> bool:
    return preset == "stock"


def decide(saved: dict, saved_world: int, spec: JobSpec, world: int, data_sha256: str | None, tag: str) -> Mode:
    """How to load a checkpoint the job recorded as ``saved`` (written at ``saved_world`` ranks)
    into ``spec`` at ``world`` ranks: "native" (DeepSpeed's own partitions, same world) or
    "universal" (converted first). Raises ``HierConfigError`` (field, value, fix) for a change
    a resume does not support. A record from an older version lacks the keys: those are not
    checked."""
    where = f"the checkpoint {tag}"

    def keep(field: str, now: Any, then: Any, why: str) -> None:
        if then is not None and now != then:
            raise HierConfigError(
                field, now, f"{where} was saved with {field}={then!r} ({why}): resume with that value"
            )

    keep("model", asdict(spec.model), saved.get("model"), "the weights' shapes follow the model")
    keep("seed", spec.seed, saved.get("seed"), "the data order is a function of the seed")
    keep(
        "dtype",
        spec.dtype,
        saved.get("dtype"),
        "a change of training precision across a resume is not supported: its optimizer state layout differs",
    )
    if "data_sha256" in saved:
        then = saved["data_sha256"]
        if then != data_sha256:
            what: dict[str | None, str] = {None: "synthetic batches"}
            raise HierConfigError(
                "data_path",
                spec.data_path,
                f"{where} was trained on {what.get(then, 'token files with sha256 ' + str(then)[:12])}, "
                f"this run reads {what.get(data_sha256, 'token files with sha256 ' + str(data_sha256)[:12])}: "
                "the saved data position means nothing in other data; resume with the same prepared directory",
            )
    then_preset = saved.get("preset")
    if then_preset is not None and _is_stock(then_preset) != _is_stock(spec.preset):
        raise HierConfigError(
            "preset",
            spec.preset,
            f"{where} was saved with preset={then_preset!r}: a resume cannot move between stock DeepSpeed "
            "(no manifest, its own loader) and a zeropp_hier preset; resume with preset="
            f"{then_preset!r}, or with any zeropp_hier preset if it was saved with one",
        )
    if saved_world == world:
        return "native"
    if _is_stock(spec.preset):
        raise HierConfigError(
            "preset",
            spec.preset,
            f"{where} was saved at {saved_world} ranks, this run has {world}: resuming at another world size "
            "converts the checkpoint to DeepSpeed's universal format, which needs a checkpoint written by a "
            f"zeropp_hier preset (a verified manifest); resume at {saved_world} ranks",
        )
    return "universal"


def universal_dir(ckpt_dir: str) -> str:
    """Where the job keeps the universal conversions of ``ckpt_dir``'s tags (beside it: the
    conversion never writes inside the directory it reads)."""
    return ckpt_dir.rstrip("/\\") + "_universal"
