"""The dry run's count of what the engine holds (dryrun/holdings.py): distinct storages once,
views of one buffer not again, empty and missing tensors as nothing."""

import torch

from zeropp_hier.dryrun.holdings import _bytes, _state_tensors


def test_views_of_one_buffer_count_once():
    flat = torch.zeros(100, dtype=torch.bfloat16)
    other = torch.zeros(10, dtype=torch.float32)
    views = [flat[:40], flat[40:], flat.view(10, 10)]
    assert _bytes([*views, other, None, torch.empty(0)]) == 100 * 2 + 10 * 4


def test_optimizer_state_tensors_are_found():
    p = torch.nn.Parameter(torch.zeros(8))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones(8)
    opt.step()
    # Adam's two moments (8 fp32 each) and its step counter (a 0-d tensor)
    assert _bytes(_state_tensors(opt.state)) == 8 * 4 * 2 + 4
