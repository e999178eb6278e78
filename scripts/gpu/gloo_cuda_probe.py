"""Which torch.distributed collectives gloo runs on CUDA tensors (2 ranks on one GPU).

    python scripts/gpu/gloo_cuda_probe.py

The GPU lane shares one GPU between several ranks, which NCCL refuses; gloo accepts CUDA tensors
for most collectives by staging them through host memory. This prints, per collective, whether
it ran and gave the right answer, so a failure of the engine on the GPU can be told apart from a
collective gloo lacks.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _cases(rank: int, world: int, dev):
    def all_reduce():
        t = torch.full((5,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        return bool((t == world * (world + 1) / 2).all())

    def all_gather_into_tensor():
        out = torch.empty(world * 3, device=dev)
        dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=dev))
        return out.tolist() == [float(r) for r in range(world) for _ in range(3)]

    def all_gather_list():
        outs = [torch.empty(3, device=dev) for _ in range(world)]
        dist.all_gather(outs, torch.full((3,), float(rank), device=dev))
        return [o[0].item() for o in outs] == [float(r) for r in range(world)]

    def reduce_scatter_tensor():
        out = torch.empty(2, device=dev)
        dist.reduce_scatter_tensor(out, torch.arange(2 * world, dtype=torch.float32, device=dev))
        return out.tolist() == [world * float(2 * rank), world * float(2 * rank + 1)]

    def all_to_all_single():
        out = torch.empty(world, device=dev)
        dist.all_to_all_single(out, torch.full((world,), float(rank), device=dev))
        return out.tolist() == [float(r) for r in range(world)]

    def broadcast():
        t = torch.full((4,), float(rank), device=dev)
        dist.broadcast(t, 0)
        return t.tolist() == [0.0] * 4

    def async_all_gather_uint8():
        out = torch.empty(world * 4, dtype=torch.uint8, device=dev)
        w = dist.all_gather_into_tensor(out, torch.full((4,), rank, dtype=torch.uint8, device=dev), async_op=True)
        w.wait()
        return out.tolist() == [r for r in range(world) for _ in range(4)]

    def bf16_all_reduce():
        t = torch.full((5,), float(rank + 1), dtype=torch.bfloat16, device=dev)
        dist.all_reduce(t)
        return bool((t.float() == world * (world + 1) / 2).all())

    return [
        all_reduce,
        all_gather_into_tensor,
        all_gather_list,
        reduce_scatter_tensor,
        all_to_all_single,
        broadcast,
        async_all_gather_uint8,
        bf16_all_reduce,
    ]


def _rank(rank: int, world: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    res = {}
    for fn in _cases(rank, world, dev):
        try:
            res[fn.__name__] = "ok" if fn() else "WRONG RESULT"
        except Exception as exc:  # noqa: BLE001 - reported, that is the point
            res[fn.__name__] = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    q.put((rank, res))
    dist.destroy_process_group()


def main() -> int:
    world, port = 2, 29611
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    for name, status in results[0].items():
        print(f"gloo + CUDA tensors: {name:24s} {status}")
    return 0 if all(v == "ok" for r in results.values() for v in r.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
