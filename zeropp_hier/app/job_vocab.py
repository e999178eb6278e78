"""The model's vocabulary written out before any rank builds it (``with_data_vocab``): from
``init_from``'s ``config.json`` (checked against the job's model), the data's tokenizer, or the
byte alphabet for synthetic batches.

Not in spec.py: it reads files and the model family (``model/pretrained.py``), which itself reads
spec.py's ``ModelSpec``; kept there, spec.py and model/pretrained.py imported each other. The spine
(launch.py, run.py) calls it; spec.py stays plain data.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.errors import HierConfigError
from .model.pretrained import with_pretrained_model
from .spec import BYTE_VOCAB, JobSpec


def with_data_vocab(spec: JobSpec) -> JobSpec:
    """``spec`` with the model's vocabulary written out when the model leaves it null: the
    data's tokenizer's size (the prepared directory's index.json), or 256 for synthetic batches
    (which draw from the model's own vocabulary, so any size serves them); a model whose
    vocabulary is smaller than the data's is refused."""
    if spec.init_from is not None:  # the model checked against the directory's config.json
        spec = with_pretrained_model(spec)
    m = spec.model
    if spec.data_path is None:  # synthetic batches draw from the model's own vocabulary
        return spec if m.vocab_size is not None else replace(spec, model=replace(m, vocab_size=BYTE_VOCAB))
    from .data.tokens import open_tokens  # numpy and torch: only when there are token files to read

    vocab = open_tokens(spec.data_path, "train", spec.data_split).vocab_size
    where = f"the tokenizer of {spec.data_path}"
    if vocab is None:  # a Megatron pair does not record its tokenizer's size
        if m.vocab_size is None:
            raise HierConfigError(
                "model.vocab_size",
                None,
                f"{spec.data_path} does not record its vocabulary: set model.vocab_size to its tokenizer's size "
                "(50432 for GPT-NeoX-20B's)",
            )
        return spec
    if m.vocab_size is None:
        return replace(spec, model=replace(m, vocab_size=vocab))
    if m.vocab_size < vocab:
        raise HierConfigError(
            "model.vocab_size",
            m.vocab_size,
            f"{where} has {vocab} tokens: use a model with at least as many (model.vocab_size={vocab}, "
            "or null to take the data's)",
        )
    return spec
