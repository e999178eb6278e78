"""The link probe times transfers, not launches ([Note: timing a collective] in
zeropp_hier/detect/links.py), on 2 real gloo ranks: rank 0 times an asynchronous all-reduce
whose call returns at once and whose completion is visible only through the synchronisation
step (``work.wait()``), while rank 1 joins each collective only after a sleep. The delay must
show in rank 0's figure; with the synchronisation left out of ``timed`` it would not, and this
test fails."""

DELAY_S = 1.0
REPS = 2


def delayed_partner(delay_s: float, reps: int):
    import time

    import torch
    import torch.distributed as dist

    from zeropp_hier.detect import links

    t = torch.ones(4)
    if dist.get_rank() == 1:  # joins every collective (warm-up and timed ones) late
        for _ in range(links.WARMUP + reps):
            time.sleep(delay_s)
            dist.all_reduce(t)
        return None
    pending: list = []

    def launch():  # returns as soon as the collective is queued, as NCCL/RCCL calls do
        pending.append(dist.all_reduce(t, async_op=True))

    def sync():  # the collective's completion, observable only here
        while pending:
            pending.pop().wait()

    seconds = links.timed(launch, sync, reps)
    sync()  # leave nothing in flight, whatever timed did
    return seconds


def test_the_timed_region_contains_the_collectives_completion(world2):
    seconds, _ = world2.run(delayed_partner, DELAY_S, REPS)
    # each timed call completes only when rank 1 joins, a sleep after the previous one: the
    # figure is at least the delay (a lower bound; load can only add to it)
    assert seconds >= 0.8 * DELAY_S, f"timed {seconds:.3f} s per call; rank 1 joined each call {DELAY_S} s late"
