"""``zeropp-hier checkpoint export-hf TAG --out DIR``: a job's checkpoint as a Hugging Face model
directory (``config.json`` + safetensors) that ``GPTNeoXForCausalLM.from_pretrained`` loads.

[Note: Hugging Face export]
The weights are DeepSpeed's consolidated fp32 master weights of the tag (``zero_to_fp32``'s
reconstruction, run by ``checkpoint.to_fp32``: the tag is verified against its manifest first
and every file is read tensors-only, so the export runs no code from the checkpoint). The job
wraps the Hugging Face model as ``CausalLM.lm`` (app/model/models.py), so the engine's names carry an
``lm.`` prefix that is dropped here. The model's shape is the job's own record of its
``ModelSpec`` (saved with every checkpoint the job writes, app/longrun/resume.py), turned into the same
``GPTNeoXConfig`` the job built the model from (``models.neox_config``), with ``use_cache`` on
for generation. Before anything is written, the names and shapes are checked against a
``GPTNeoXForCausalLM`` of that config built on the meta device (no memory): a missing,
unexpected or misshapen tensor stops the export naming it. Tensors go to ``model.safetensors``,
or, above ``max_shard_bytes``, to ``model-0000i-of-0000n.safetensors`` shards with
``model.safetensors.index.json`` (the layout ``from_pretrained`` reads). Everything is written
into ``<out>.tmp-export`` and renamed to ``<out>`` at the end: an export that fails leaves
nothing that looks complete. The consolidation holds the whole fp32 model in host memory
(4 bytes per parameter: 80 GB for GPT-NeoX-20B).

``fp32_script_main`` is what the ``zero_to_fp32.py`` the job leaves beside its tags runs
(``deepspeed/checkpoint/recovery_script.py``): the same verified, tensors-only consolidation, written as
safetensors under the engine's own names.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Any

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
PREFIX = "lm."
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def locate(path: str, tag: str | None = None) -> tuple[str, str | None]:
    """(checkpoint directory, tag) of ``path``: a tag directory (``ckpt/step30``), or the
    checkpoint directory itself (its ``latest``, or ``tag``)."""
    from ..core.errors import HierCheckpointError
    from ..deepspeed.checkpoint.files import MANIFEST

    path = os.path.normpath(path)
    if not os.path.isdir(path):
        raise HierCheckpointError(
            path, "no such directory", "give a tag directory (CKPT/TAG) or a checkpoint directory"
        )
    if tag is None and os.path.isfile(os.path.join(path, MANIFEST)):
        return os.path.dirname(path) or ".", os.path.basename(path)
    return path, tag


def model_spec(ckpt_dir: str, tag: str):
    """The ``ModelSpec`` the job recorded in the tag (rank 0's model states file, read
    tensors-only)."""
    from ..app.longrun import resume
    from ..app.model.models import ModelSpec
    from ..core.errors import HierConfigError

    job = resume._job_state(os.path.join(ckpt_dir, tag), None)  # the files were verified by to_fp32
    record = (job.get("record") or {}).get("model")
    if not isinstance(record, dict):
        raise HierConfigError(
            "export-hf",
            os.path.join(ckpt_dir, tag),
            "no model record in it: export a checkpoint `zeropp-hier train` saved",
        )
    spec = ModelSpec(**record)
    if spec.arch != "neox":
        raise HierConfigError("model.arch", spec.arch, "only GPT-NeoX models (arch neox) have a Hugging Face class")
    return spec


def hf_state_dict(state: dict, config) -> dict:
    """``state`` (engine names) under the Hugging Face model's names, checked against a model of
    ``config`` built on the meta device."""
    import torch
    from transformers import GPTNeoXForCausalLM

    from ..core.errors import HierConfigError

    named = {k[len(PREFIX) :] if k.startswith(PREFIX) else k: v for k, v in state.items()}
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in GPTNeoXForCausalLM(config).state_dict().items()}
    missing, unexpected = sorted(set(want) - set(named)), sorted(set(named) - set(want))
    misshapen = sorted(k for k in set(want) & set(named) if tuple(named[k].shape) != want[k])
    if missing or unexpected or misshapen:
        raise HierConfigError(
            "export-hf",
            f"missing {missing[:4]}, unexpected {unexpected[:4]}, misshapen {misshapen[:4]}",
            "the checkpoint does not hold the model its record describes: export the checkpoint the job wrote",
        )
    return named


def _shards(state: dict, max_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(state):
        n = state[name].numel() * state[name].element_size()
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def write_safetensors(state: dict, out: str, max_bytes: int) -> list[str]:
    """``state`` as safetensors in ``out`` (one file, or shards and their index); returns the
    file names."""
    from safetensors.torch import save_file

    groups = _shards(state, max_bytes)
    if len(groups) == 1:
        names = [SINGLE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for name, keys in zip(names, groups):
        # own, contiguous storage per tensor: safetensors refuses tensors that share memory
        save_file({k: state[k].detach().contiguous().clone() for k in keys}, os.path.join(out, name), {"format": "pt"})
    if len(groups) > 1:
        total = sum(t.numel() * t.element_size() for t in state.values())
        index = {"metadata": {"total_size": total}, "weight_map": {k: n for n, ks in zip(names, groups) for k in ks}}
        with open(os.path.join(out, INDEX), "w") as f:
            json.dump(index, f, indent=1)
    return names


def _fresh_out(out_dir: str) -> str:
    from ..core.errors import HierCheckpointError

    if os.path.lexists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise HierCheckpointError(
            out_dir, "exists and is not empty: an export never replaces files", "give a new --out"
        )
    tmp = out_dir.rstrip("/") + ".tmp-export"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def _commit(tmp: str, out_dir: str) -> None:
    if os.path.isdir(out_dir):
        os.rmdir(out_dir)  # empty (checked by _fresh_out)
    os.replace(tmp, out_dir)


def export_hf(
    path: str,
    out_dir: str,
    tag: str | None = None,
    dtype: str = "fp32",
    max_shard_bytes: int = 5 * 10**9,
    tokenizer: str | None = None,
    trust_pickles: bool = False,
) -> dict[str, Any]:
    """Write ``out_dir`` from the checkpoint at ``path`` ([Note: Hugging Face export]); returns
    what was written."""
    import torch

    from ..app.model.models import neox_config
    from ..core.errors import HierConfigError
    from ..deepspeed import checkpoint

    if dtype not in DTYPES:
        raise HierConfigError("--dtype", dtype, f"use one of {list(DTYPES)}")
    if tokenizer is not None and not os.path.isfile(tokenizer):
        raise HierConfigError(
            "--tokenizer", tokenizer, "no such file: give the tokenizer.json the data was prepared with"
        )
    ckpt_dir, tag = locate(path, tag)
    resolved = checkpoint.resolve_tag(ckpt_dir, tag)
    if resolved is None:
        raise checkpoint.missing_latest_error(ckpt_dir)
    tmp = _fresh_out(out_dir)  # before the (long) consolidation: a bad --out costs nothing
    try:
        state = checkpoint.to_fp32(ckpt_dir, resolved, trust_pickles=trust_pickles)
        spec = model_spec(ckpt_dir, resolved)
        config = neox_config(spec)
        config.use_cache = True
        config.architectures = ["GPTNeoXForCausalLM"]
        torch_dtype = getattr(torch, DTYPES[dtype])
        config.dtype = torch_dtype
        if tokenizer is not None:  # generation stops at the tokenizer's EOS, not GPTNeoXConfig's default id 2
            from ..app.data.prepare_stream import eos_of

            try:
                config.eos_token_id = config.bos_token_id = eos_of(tokenizer)[1]  # GPT-NeoX-20B: both 0
            except HierConfigError:
                pass  # no EOS token known in it: GPTNeoXConfig's defaults stay
        named = hf_state_dict(state, config)
        del state
        named = {k: v.to(torch_dtype) for k, v in named.items()}
        config.save_pretrained(tmp)
        files = write_safetensors(named, tmp, max_shard_bytes)
        if tokenizer is not None:
            shutil.copyfile(tokenizer, os.path.join(tmp, "tokenizer.json"))
        _commit(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    params = sum(v.numel() for v in named.values())
    return {
        "out": out_dir,
        "tag": resolved,
        "files": files,
        "params": params,
        "dtype": dtype,
        "eos": config.eos_token_id,
    }


def _size(text: str) -> int:
    from .cli import parse_count

    try:
        v = parse_count(text.upper().removesuffix("B") if text.upper().endswith(("KB", "MB", "GB", "TB")) else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; give a size such as 5GB or 500MB") from None
    if not v >= 1:
        raise argparse.ArgumentTypeError(f"got {text!r}; give a size such as 5GB or 500MB")
    return int(v)


def main(argv: list[str] | None = None, prog: str = "zeropp-hier checkpoint export-hf") -> int:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Write a checkpoint tag as a Hugging Face model directory (config.json + safetensors) "
        "that GPTNeoXForCausalLM.from_pretrained loads. The tag is verified and read tensors-only.",
    )
    ap.add_argument("tag", metavar="TAG", help="a tag directory (CKPT/step30), or a checkpoint directory (its latest)")
    ap.add_argument("--out", required=True, help="the model directory to write (new, or empty)")
    ap.add_argument("--tag", dest="tag_name", default=None, help="the tag, when TAG is a checkpoint directory")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="weights' dtype (default fp32)")
    ap.add_argument("--max-shard-size", type=_size, default="5GB", help="largest safetensors file (default 5GB)")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer.json to copy beside the weights")
    from ..deepspeed.checkpoint import add_trust_pickles

    add_trust_pickles(ap)
    a = ap.parse_args(argv)
    from ..core.errors import HierCheckpointError, HierConfigError

    try:
        done = export_hf(a.tag, a.out, a.tag_name, a.dtype, a.max_shard_size, a.tokenizer, a.trust_pickles)
    except (HierCheckpointError, HierConfigError) as e:
        print(f"error: {e}")
        return 1
    print(
        f"{done['out']}: {done['params'] / 1e6:.2f}M parameters of tag {done['tag']} as {done['dtype']} "
        f"({', '.join(done['files'])}, config.json with eos_token_id {done['eos']}): "
        f"GPTNeoXForCausalLM.from_pretrained({done['out']!r})"
    )
    return 0


def fp32_script_main(argv: list[str]) -> int:
    """What ``zero_to_fp32.py`` beside the job's tags runs: DeepSpeed's arguments
    (``checkpoint_dir output_dir [-t TAG]``), the verified tensors-only consolidation, written
    as safetensors under the engine's names."""
    ap = argparse.ArgumentParser(
        prog="zero_to_fp32.py",
        description="Consolidated fp32 weights of a zeropp-hier checkpoint, read tensors-only, as safetensors. "
        "For a Hugging Face model directory: zeropp-hier checkpoint export-hf CKPT/TAG --out DIR",
    )
    ap.add_argument("checkpoint_dir")
    ap.add_argument("output_dir")
    ap.add_argument("-t", "--tag", default=None)
    ap.add_argument("--max_shard_size", type=_size, default="5GB")
    ap.add_argument("--safe_serialization", action="store_true", help="accepted: the output is always safetensors")
    ap.add_argument("--trust-pickles", action="store_true")
    a = ap.parse_args(argv)
    from ..core.errors import HierCheckpointError
    from ..deepspeed import checkpoint

    try:
        state = checkpoint.to_fp32(a.checkpoint_dir, a.tag, trust_pickles=a.trust_pickles)
        os.makedirs(a.output_dir, exist_ok=True)
        files = write_safetensors(state, a.output_dir, a.max_shard_size)
    except HierCheckpointError as e:
        print(f"error: {e}")
        return 1
    print(f"{a.output_dir}: {', '.join(files)} (fp32, engine names; read tensors-only)")
    return 0
