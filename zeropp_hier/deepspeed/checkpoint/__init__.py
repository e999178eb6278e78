"""Checkpoints in DeepSpeed's own format, atomic and verified ([Note: atomic checkpoint] in
deepspeed/checkpoint/atomic.py), and what reads and converts them:

- ``atomic``: the engine's save and load as transactions across ranks, the conversions
  (``to_universal``, ``to_fp32``) and the ``zeropp-hier checkpoint`` command (``main``);
- ``files``: a checkpoint directory's files without torch.distributed (names, the manifest, the
  checks of a tag, rank 0's commit and recovery);
- ``shares``: a tag's checks across ranks, each rank its share ([Note: checks in shares]), and
  in one process (``verify_tag``);
- ``pieces``: a manifest in pieces, each rank's own ([Note: a manifest in pieces]);
- ``names``: the plain relative names a checkpoint records;
- ``writes``: DeepSpeed's own file writes during a save, a failure held ([Note: a rank that
  cannot write]);
- ``universal``: the conversion to the universal format in shares ([Note: a conversion in shares]);
- ``safe_load``: loading files without running code ([Note: tensors-only loading]);
- ``recovery_script``: the ``zero_to_fp32.py`` beside the tags, replaced.

This package is the public face, as the one module ``zeropp_hier.deepspeed.checkpoint`` was
before: ``checkpoint.to_universal``, ``checkpoint.to_fp32``, ``checkpoint.verify_tag`` and
``python -m zeropp_hier.deepspeed.checkpoint`` (docs/usage.md, docs/reliability.md) work as
they did. A test that replaces a function replaces it in its module (``atomic``, ``files``)."""

from ...core.errors import HierCheckpointError
from .atomic import add_trust_pickles, coordinate_files, main, own_files, save, to_fp32, to_universal, verify_for_load
from .files import (
    COMMIT_STEPS,
    CRASH_ENV,
    MANIFEST,
    MANIFEST_FORMAT,
    OLD_PREFIX,
    POINTERS,
    SHARED_FIX,
    TMP_PREFIX,
    check_files,
    check_tag_name,
    clean_leftovers,
    commit,
    complete_tags,
    file_digest,
    first_problem,
    fsync_dir,
    leftovers,
    list_files,
    missing_latest_error,
    name_problem,
    raise_problems,
    raise_rank_errors,
    read_manifest,
    recover,
    resolve_tag,
    tag_entries,
    write_atomic,
)
from .shares import verify_tag

__all__ = [
    "COMMIT_STEPS",
    "CRASH_ENV",
    "HierCheckpointError",
    "MANIFEST",
    "MANIFEST_FORMAT",
    "OLD_PREFIX",
    "POINTERS",
    "SHARED_FIX",
    "TMP_PREFIX",
    "add_trust_pickles",
    "check_files",
    "check_tag_name",
    "clean_leftovers",
    "commit",
    "complete_tags",
    "coordinate_files",
    "file_digest",
    "first_problem",
    "fsync_dir",
    "leftovers",
    "list_files",
    "main",
    "missing_latest_error",
    "name_problem",
    "own_files",
    "raise_problems",
    "raise_rank_errors",
    "read_manifest",
    "recover",
    "resolve_tag",
    "save",
    "tag_entries",
    "to_fp32",
    "to_universal",
    "verify_for_load",
    "verify_tag",
    "write_atomic",
]
