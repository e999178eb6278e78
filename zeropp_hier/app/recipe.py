"""The recipes' side of the job, pure: the one warning a GPU run with the CPU demo's toy
settings starts with, and where the job writes the DeepSpeed config it built.

The recipes themselves are Hydra options (``configs/recipe/``): ``demo`` (JobSpec's defaults),
``neox20b`` and ``neox1_4b`` (GPT-NeoX's published settings; docs/usage.md#recipes).
"""

from __future__ import annotations

import json
import os

from .spec import JobSpec, n_params

BIG_MODEL = 1e9  # parameters above which the demo's settings are toy settings on a GPU
TOY_LR = 1e-3  # the demo's 3e-3 and anything near it diverges on a billion-parameter model


def toy_settings_warning(spec: JobSpec) -> str | None:
    """One line naming each demo setting a GPU run of a model above 1B parameters still has
    (lr >= 1e-3, prefetch off, fp32) and the recipe to use; None when there is none."""
    params = n_params(spec.model)
    if params <= BIG_MODEL:
        return None
    toy = []
    if spec.lr >= TOY_LR:
        toy.append(f"lr={spec.lr:g} (>= {TOY_LR:g})")
    if spec.regather:
        toy.append("regather=true (DeepSpeed prefetch off)")
    if spec.dtype == "fp32":
        toy.append("dtype=fp32")
    if not toy:
        return None
    recipe = "neox20b" if params > 1e10 else "neox1_4b"
    return (
        f"WARNING: a {params / 1e9:.3g}B-parameter model on GPUs with the CPU demo's settings: "
        f"{', '.join(toy)}; use recipe={recipe} (GPT-NeoX's published settings, docs/usage.md#recipes)"
    )


def write_ds_config(out_dir: str | None, config: dict) -> str | None:
    """Write the DeepSpeed config the job built to ``<out_dir>/ds_config.json``; its path, or None
    without an output directory."""
    if not out_dir:
        return None
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "ds_config.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    return path
