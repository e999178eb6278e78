"""``init_from=DIR``: a Hugging Face GPT-NeoX model directory (``save_pretrained``'s, a hub
snapshot such as Pythia's, or ``zeropp-hier checkpoint export-hf``'s) as the job's initial
weights, read into the model while it is partitioned: no rank ever holds the whole model.

[Note: pretrained weights in]
The model's shape comes from the directory's ``config.json``, read as JSON (no code runs): each
field that decides the model's weights or its forward is compared with the job's ``model=``
(``model_spec``) and a difference is refused naming the field, both values and the named size
that agrees, if one does; a job whose ``model.vocab_size`` is null takes the directory's.
``model.seq_len`` may be shorter than the directory's ``max_position_embeddings`` (rotary
positions are computed, not learned: the same weights serve any length up to it).

The model is built partitioned as always (models.py, [Note: building a model sharded]); then every
rank copies into each parameter's own partition (``ds_tensor``: DeepSpeed's primary partition,
the flat range ``[rank * n, (rank + 1) * n)`` of the flattened weight, zero-padded at the end)
just the rows of the file that cover that range, and the engine is built on top, so the
optimizer's fp32 master copy starts from the file's values. No collective runs: a rank reads its
own ranges only. Safetensors files are read lazily (``safe_open(...).get_slice``: the rows asked
for, nothing else); a ``pytorch_model.bin`` is opened with ``torch.load(weights_only=True,
mmap=True)`` (tensors only, never code: the project's rule for every checkpoint it reads) and
only the pages of the rows sliced are read. The peak host memory of a rank is its partitions of
the model in the model's dtype plus one tensor's slice at a time (at most two rows more than its
range): for GPT-NeoX-20B on 384 GCDs 20.6B x 4 bytes / 384 = 214 MB of fp32 (what ZeRO-3 keeps
anyway) and one slice, besides the file pages touched.

Names: the file's names are the Hugging Face model's (the job's engine names carry ``lm.``,
models.CausalLM); transformers 4's ``embed_out`` is read as 5's ``lm_head``; the buffers older
checkpoints carry (attention masks, rotary frequencies) are skipped; a weight the model has and
the files lack, or one the files have and the model does not know, stops the load naming it.
A GPT-NeoX scheme (init_method small_init, ...) is not drawn under ``init_from``: the file's
weights replace every parameter. In a bf16 or fp16 job the partitions are in that dtype, so the
optimizer's fp32 master copy starts from the file's values rounded to it (as DeepSpeed's own
``from_pretrained`` under ZeRO-3 does); a resumed run loads its checkpoint and reads no file here.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any, Iterator

from ...core.errors import HierConfigError
from ..spec import MODELS, JobSpec, ModelSpec

FIELD = "init_from"
CONFIG = "config.json"
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PYTORCH, PYTORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
# names transformers renamed between the file's version and the model's (file -> model)
RENAMED = {"embed_out.weight": "lm_head.weight"}
# buffers some checkpoints carry that no parameter reads (transformers skips them too)
SKIPPED_SUFFIXES = ("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq", "rotary_emb.original_inv_freq")
# config.json fields that the job's ModelSpec sets, by ModelSpec field (models.NEOX_NAMES)
SPEC_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "intermediate_size": "intermediate",
    "use_parallel_residual": "parallel_residual",
}


def _rope(cfg: dict) -> tuple[float, float]:
    """(rotary share, rotary base) in either transformers' spelling (4: ``rotary_pct`` and
    ``rotary_emb_base``; 5: ``rope_parameters``)."""
    rope = cfg.get("rope_parameters") or {}
    pct = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", cfg.get("rotary_pct", 0.25)))
    base = rope.get("rope_theta", cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000)))
    return float(pct), float(base)


# what the job builds beside its ModelSpec (models.neox_config and GPTNeoXConfig's defaults):
# (config.json field, the job's value, how to read it from config.json)
FIXED: tuple[tuple[str, Any, Any], ...] = (
    ("model_type", "gpt_neox", lambda c: c.get("model_type")),
    ("tie_word_embeddings", False, lambda c: bool(c.get("tie_word_embeddings", False))),
    ("hidden_act", "gelu", lambda c: c.get("hidden_act", "gelu")),
    ("layer_norm_eps", 1e-5, lambda c: float(c.get("layer_norm_eps", 1e-5))),
    ("attention_bias", True, lambda c: bool(c.get("attention_bias", True))),
    ("rope_theta", 10000.0, lambda c: _rope(c)[1]),
    ("rope_scaling", None, lambda c: c.get("rope_scaling") or None),
)


def read_config(path: str) -> dict:
    """The directory's ``config.json`` as plain JSON (no code runs), refused naming ``init_from``
    when it is not a GPT-NeoX model directory."""
    if not os.path.isdir(path):
        raise HierConfigError(FIELD, path, "no such directory: give a Hugging Face model directory (save_pretrained')")
    file = os.path.join(path, CONFIG)
    try:
        with open(file) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise HierConfigError(FIELD, path, f"no {CONFIG} in it: give a Hugging Face model directory") from None
    except (OSError, ValueError) as e:
        raise HierConfigError(FIELD, file, f"cannot be read as JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise HierConfigError(FIELD, file, "is not a JSON object")
    return cfg


def spec_of(cfg: dict, seq_len: int) -> ModelSpec:
    """The ``ModelSpec`` a GPT-NeoX ``config.json`` describes (at the job's ``seq_len``); a field
    it leaves out has GPTNeoXConfig's default, which is GPT-NeoX-20B's shape."""
    default = MODELS["neox_20b"]
    fields: dict[str, Any] = {ours: cfg.get(hf, getattr(default, ours)) for hf, ours in SPEC_FIELDS.items()}
    fields["parallel_residual"] = bool(fields["parallel_residual"])
    for hf, ours in SPEC_FIELDS.items():
        if ours != "parallel_residual" and (not isinstance(fields[ours], int) or fields[ours] < 1):
            raise HierConfigError(
                f"{FIELD} ({CONFIG} {hf})", fields[ours], "a GPT-NeoX config.json has a positive integer"
            )
    return ModelSpec(arch="neox", seq_len=seq_len, rotary_pct=_rope(cfg)[0], **fields)


def _matching_size(want: ModelSpec) -> str | None:
    for name, size in MODELS.items():
        if replace(size, seq_len=want.seq_len) == want:
            return name
    return None


def model_spec(job: ModelSpec, path: str, cfg: dict | None = None) -> ModelSpec:
    """The job's model checked against the directory's ``config.json`` ([Note: pretrained weights
    in]); returns it with the vocabulary written out. Pure but for reading ``config.json``."""
    cfg = read_config(path) if cfg is None else cfg
    file = os.path.join(path, CONFIG)
    for field, ours, read in FIXED:
        theirs = read(cfg)
        if theirs != ours:
            raise HierConfigError(
                f"{FIELD} ({CONFIG} {field})",
                theirs,
                f"the job builds GPT-NeoX with {field} = {ours!r}: {file} describes another model",
            )
    if job.arch != "neox":
        raise HierConfigError("model.arch", job.arch, f"{FIELD} loads GPT-NeoX weights: use model.arch=neox")
    want = spec_of(cfg, job.seq_len)
    size = _matching_size(want)
    fix = f"use model={size}" if size else "set model.{name}={value}"
    for name in ("vocab_size", "hidden", "heads", "layers", "intermediate", "rotary_pct", "parallel_residual"):
        ours, theirs = getattr(job, name), getattr(want, name)
        if name == "vocab_size" and ours is None:
            continue  # left to the data or the directory: the directory's
        if ours != theirs:
            hf = next((k for k, v in SPEC_FIELDS.items() if v == name), "rotary_pct")
            raise HierConfigError(
                f"model.{name}",
                ours,
                f"{file} has {hf} = {theirs!r}: {fix.format(name=name, value=theirs)} (the model comes from {FIELD})",
            )
    max_pos = cfg.get("max_position_embeddings")
    if isinstance(max_pos, int) and job.seq_len > max_pos:
        raise HierConfigError(
            "model.seq_len",
            job.seq_len,
            f"{file} has max_position_embeddings = {max_pos}: train sequences of at most that many tokens",
        )
    return replace(job, vocab_size=want.vocab_size)


def with_pretrained_model(spec: JobSpec) -> JobSpec:
    """``spec`` with its model checked against ``init_from``'s and its vocabulary written out."""
    if spec.init_from is None:
        return spec
    return replace(spec, model=model_spec(spec.model, spec.init_from))


# -- the weights -----------------------------------------------------------------------------


def weight_files(path: str) -> tuple[str, dict[str, str]]:
    """(format, {tensor name: file}) of a model directory: one safetensors file or its shards
    with their index, else a ``pytorch_model.bin`` or its shards with their index."""
    for single, index, kind in ((SAFETENSORS, SAFETENSORS_INDEX, "safetensors"), (PYTORCH, PYTORCH_INDEX, "torch")):
        index_file = os.path.join(path, index)
        if os.path.isfile(index_file):
            try:
                with open(index_file) as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise HierConfigError(FIELD, index_file, f"not a weight index ({e!r})") from None
            return kind, {name: os.path.join(path, file) for name, file in weight_map.items()}
        if os.path.isfile(os.path.join(path, single)):
            return kind, {"": os.path.join(path, single)}  # names: the file's own
    raise HierConfigError(
        FIELD,
        path,
        f"no weights in it ({SAFETENSORS}, {SAFETENSORS_INDEX}, {PYTORCH} or {PYTORCH_INDEX}): "
        "give the directory save_pretrained or zeropp-hier checkpoint export-hf wrote",
    )


def shard_range(numel: int, partition_numel: int, part_rank: int) -> tuple[int, int]:
    """The flat range ``[start, stop)`` of a weight of ``numel`` elements that partition
    ``part_rank`` of DeepSpeed's primary partitioning holds (pure); elements of the partition
    past ``stop`` are padding."""
    start = min(numel, part_rank * partition_numel)
    return start, min(numel, start + partition_numel)


def row_span(shape: tuple[int, ...], start: int, stop: int) -> tuple[int, int, int]:
    """(first row, end row, offset of ``start`` in the first row) of the rows along dimension 0
    that cover the flat range ``[start, stop)`` of a row-major tensor of ``shape`` (pure)."""
    row = 1
    for d in shape[1:]:
        row *= d
    if stop <= start:
        return 0, 0, 0
    first, end = start // row, -(-stop // row)
    return first, end, start - first * row


class _Reader:
    """Tensors by name from the directory's files, opened once each, read by rows."""

    def __init__(self, kind: str, files: dict[str, str]):
        self.kind, self.files = kind, files
        self.handles: dict[str, Any] = {}
        self.names: dict[str, str] = {}  # tensor name -> file
        for name, file in files.items():
            if name:
                self.names[name] = file
            else:
                self.names.update({n: file for n in self._open(file).keys()})

    def _open(self, file: str):
        if file not in self.handles:
            try:
                if self.kind == "safetensors":
                    from safetensors import safe_open

                    self.handles[file] = safe_open(file, framework="pt")
                else:
                    import torch

                    self.handles[file] = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # a file that is not what its name says: named, never run
                raise HierConfigError(
                    FIELD, file, f"cannot be read tensors-only ({type(e).__name__}: {e}); save it as safetensors"
                ) from None
        return self.handles[file]

    def shape(self, name: str) -> tuple[int, ...]:
        h = self._open(self.names[name])
        if self.kind == "safetensors":
            return tuple(h.get_slice(name).get_shape())
        return tuple(h[name].shape)

    def rows(self, name: str, first: int, end: int):
        h = self._open(self.names[name])
        if self.kind == "safetensors":
            return h.get_slice(name)[first:end]
        return h[name][first:end].clone()


def _file_names(reader: _Reader, model_names: set[str]) -> Iterator[tuple[str, str]]:
    """(model name, file name) pairs; refuses unknown names in the files."""
    unknown = []
    for name in sorted(reader.names):
        target = RENAMED.get(name, name) if name not in model_names else name
        if target in model_names:
            yield target, name
        elif not name.endswith(SKIPPED_SUFFIXES):
            unknown.append(name)
    if unknown:
        raise HierConfigError(
            FIELD, f"unexpected weights {unknown[:4]}", "the files hold another model than config.json describes"
        )


def load_into(model, path: str) -> dict[str, int]:
    """Copy the weights of the model directory ``path`` into ``model`` (a ``CausalLM`` that
    models.build made, before the engine is built; [Note: pretrained weights in]). Partitioned
    parameters get their own ranges only; whole ones (a build without ZeRO-3) the whole tensor.
    Returns what this rank read: {"tensors", "elements"}."""
    import torch
    import torch.distributed as dist

    lm = model.lm
    params = dict(lm.named_parameters())
    reader = _Reader(*weight_files(path))
    pairs = dict(_file_names(reader, set(params)))
    missing = sorted(set(params) - set(pairs))
    if missing:
        raise HierConfigError(FIELD, f"missing weights {missing[:4]}", "the files lack weights the model has")
    read = 0
    with torch.no_grad():
        for target, name in sorted(pairs.items()):
            p = params[target]
            full_shape = tuple(p.ds_shape) if hasattr(p, "ds_id") else tuple(p.shape)
            shape = reader.shape(name)
            if shape != full_shape:
                raise HierConfigError(FIELD, f"{name} of shape {list(shape)}", f"the model's is {list(full_shape)}")
            if hasattr(p, "ds_id"):  # this rank's partition only
                part = p.ds_tensor
                rank = dist.get_rank(group=p.ds_process_group)
                start, stop = shard_range(p.ds_numel, part.ds_numel, rank)
                first, end, offset = row_span(shape, start, stop)
                flat = reader.rows(name, first, end).reshape(-1)[offset : offset + stop - start]
                part.data.zero_()  # the padding past the weight's end
                part.data[: stop - start].copy_(flat.to(part.dtype))
                read += stop - start
            else:
                p.data.copy_(reader.rows(name, 0, shape[0]).to(p.dtype))
                read += p.numel()
    runtime = _runtime(params.values())
    if runtime is not None:  # copies kept from the build's initial gathers are stale now
        runtime.drop_shards([p for p in params.values() if hasattr(p, "ds_id")])
    return {"tensors": len(pairs), "elements": read}


def _runtime(params):
    from ...deepspeed.partition import runtime_of

    for p in params:
        owner = runtime_of(p)
        if owner is not None:
            return owner
    return None
