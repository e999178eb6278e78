"""Rank functions of tests/dist/test_packed_rows.py: the engine with every quantizing bucket
whose whole-block padding outweighs its values packed ([Note: per-rank costs flat in the world]
in core/layout.py), as at 75,264 ranks, on a world of test size."""

import torch

from zeropp_hier.core import layout
from zeropp_hier.deepspeed import runtime

from . import ranks_training


def run_packed(configs: dict, steps: int) -> dict:
    """Train each config with ``PAD_ALLOWANCE`` 0 (so small tensors' buckets pack), recording
    each gather's values: how many backward values differ from the forward's of the same step
    (the kept copy must decode exactly the weights the forward used), and how many gathers ran
    from a whole kept row ([Note: kept copies of packed buckets] in comm/gather.py)."""
    real_bucket = runtime.HierRuntime._bucket
    real_row = runtime.HierRuntime._kept_row_bucket
    seen = {"rows": 0, "packed": 0, "compared": 0, "differ": 0}
    forward: dict[int, torch.Tensor] = {}

    def bucket(self, ps, src, shards, phase):
        b = real_bucket(self, ps, src, shards, phase)
        if b.valid is not None and not isinstance(shards, list):  # a padded row from the primary
            sizes = [p.ds_tensor.ds_numel for p in ps]
            seen["packed"] += int(sum(layout.aligned(n, b.align) for n in sizes) != b.width)

        def finish(full):
            out = b.finish(full)
            for ds_id, t in out.items():
                if phase == "forward_gather":
                    forward[ds_id] = t.detach().clone()
                elif phase == "backward_gather" and ds_id in forward:
                    seen["compared"] += 1
                    seen["differ"] += int(not torch.equal(forward[ds_id], t))
            return out

        return b._replace(finish=finish)

    def row(self, *a, **k):
        seen["rows"] += 1
        return real_row(self, *a, **k)

    out = {}
    allowance = layout.PAD_ALLOWANCE
    layout.PAD_ALLOWANCE = 0
    runtime.HierRuntime._bucket = bucket  # type: ignore[method-assign]
    runtime.HierRuntime._kept_row_bucket = row  # type: ignore[method-assign]
    try:
        for name, cfg in configs.items():
            for k in seen:
                seen[k] = 0
            forward.clear()
            res = ranks_training.run_configs({name: cfg}, steps)[name]
            out[name] = {"losses": res["losses"], **seen}
    finally:
        layout.PAD_ALLOWANCE = allowance
        runtime.HierRuntime._bucket = real_bucket  # type: ignore[method-assign]
        runtime.HierRuntime._kept_row_bucket = real_row  # type: ignore[method-assign]
    return out
