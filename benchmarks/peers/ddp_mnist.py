#!/usr/bin/env python3
"""PyTorch DistributedDataParallel peer of bench_mnist_step: seed 002's MNIST network
(Flatten, Linear 784 -> 512, ReLU, Linear 512 -> 512, ReLU, Linear 512 -> 10),
CrossEntropyLoss, SGD(lr=1e-2), batch 32 per process, DDP over gloo, on N processes
(default 2), one thread each, on one machine.

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 benchmarks/peers/ddp_mnist.py \
        --out benchmarks/results/ddp_mnist_np2.json

A step is zero_grad, forward, loss, backward (DDP all-reduces the gradient buckets
during it) and optimizer.step(), timed on every process after a barrier; a step's time
is the slowest process's. Prints and writes (--out) the mean, median and fastest step
in milliseconds, and each process's peak resident memory. Needs Debian's python3-torch (apt-get install python3-torch); it is
not a dependency of tessera or of its tests.
"""

import argparse
import json
import os
import resource
import statistics
import time


def worker(rank, world, args, queue):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)  # one core per process, as tessera's ranks
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    net = nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 10),
    )
    for m in net:
        if isinstance(m, nn.Linear):  # MindSpore's "normal" and "zeros"
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
    model = nn.parallel.DistributedDataParallel(net)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.rand(args.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)

    times = []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        t = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(t)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    peak = torch.zeros(world, dtype=torch.float64)
    peak[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB -> MiB
    dist.all_reduce(peak)
    if rank == 0:
        queue.put((slowest.tolist(), peak.tolist()))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="samples per process")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    import torch
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(args.ranks, args, queue), nprocs=args.ranks, join=True)
    times, peak = queue.get()
    ms = [1e3 * t for t in times]
    result = {
        "peer": "pytorch_ddp_gloo",
        "torch": torch.__version__,
        "ranks": args.ranks,
        "batch_per_rank": args.batch,
        "steps": len(ms),
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "samples_per_s": args.batch * args.ranks / (statistics.median(ms) / 1e3),
        "peak_rss_mib_per_rank": peak,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
