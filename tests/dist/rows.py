"""Bit-for-bit comparison of gathered rows, for rank functions of worlds that never import
DeepSpeed (tests/helpers.py does, through its fp16 check)."""


def same_rows(a, b) -> bool:
    """Gathered rows or kept copies equal bit for bit: tensors, or encoded rows (data, scales and
    format), or both absent."""
    import torch

    from zeropp_hier.comm.collectives import Encoded

    if isinstance(a, Encoded) or isinstance(b, Encoded):
        return (
            isinstance(a, Encoded)
            and isinstance(b, Encoded)
            and torch.equal(a.data, b.data)
            and torch.equal(a.scales, b.scales)
            and (a.bits, a.block_size, a.row_elems) == (b.bits, b.block_size, b.row_elems)
        )
    return (a is None and b is None) or torch.equal(a, b)
