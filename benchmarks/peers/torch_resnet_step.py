#!/usr/bin/env python3
"""PyTorch peer of bench_resnet_step: seed 001's training step with torchvision's
resnet50(num_classes=10), CrossEntropyLoss, SGD(lr=0.01, momentum=0.9), batch 32 per
process of float32 NCHW images on the CPU; one process with --threads threads, or
DistributedDataParallel over gloo on --ranks processes (one thread each unless
--threads says otherwise), on one machine:

    OMP_NUM_THREADS=2 build/benchmarks/bench_resnet_step --image-size 32 \\
        --benchmark_out=benchmarks/results/bench_resnet_step_32_np1_t2.json --benchmark_out_format=json
    /usr/bin/python3 benchmarks/peers/torch_resnet_step.py --image-size 32 --ranks 1 --threads 2 \\
        --out benchmarks/results/torch_resnet_step_32_np1_t2.json \\
        --compare benchmarks/results/bench_resnet_step_32_np1_t2.json

A step is zero_grad, forward, loss, backward (DDP all-reduces the gradient buckets
during it) and optimizer.step(), timed on every process after a barrier; a step's time
is the slowest process's. Prints and writes (--out) the median and fastest step in
milliseconds, images per second (the global batch over the median step) and each
process's peak resident memory. --compare reads bench_resnet_step's JSON and prints
tessera's images per second over PyTorch's (above 1: tessera is faster) and both peak
memories. Needs Debian's python3-torch and python3-torchvision (apt-get install
python3-torchvision); they are not dependencies of tessera or of its tests.
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
    import torchvision

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device)
    distributed = world > 1
    if distributed:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    net = torchvision.models.resnet50(num_classes=10).to(device)
    net.train()
    model = nn.parallel.DistributedDataParallel(net) if distributed else net
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.rand(args.batch, 3, args.image_size, args.image_size, generator=g) * 2 - 1
    y = torch.randint(0, 10, (args.batch,), generator=g)
    x, y = x.to(device), y.to(device)

    times = []
    between_steps_mib = 0.0
    for step in range(args.warmup + args.steps):
        if distributed:
            dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        profiled = cuda and step + 1 == args.profile_step
        if profiled:
            between_steps_mib = torch.cuda.memory_allocated() / 2**20
            torch.cuda.cudart().cudaProfilerStart()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter() - t0
        if profiled:
            torch.cuda.cudart().cudaProfilerStop()
        if step >= args.warmup:
            times.append(t)
    slowest = torch.tensor(times, dtype=torch.float64)
    peak = torch.zeros(world, dtype=torch.float64)
    peak[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB -> MiB
    if distributed:
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        dist.all_reduce(peak)
    if rank == 0:
        params = sum(p.numel() for p in net.parameters())
        device_mib = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
        queue.put((slowest.tolist(), peak.tolist(), params, torch.__version__, device_mib, between_steps_mib))
    if distributed:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="threads per process (default: 2 alone, 1 under DDP)")
    ap.add_argument("--batch", type=int, default=32, help="samples per process")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=29519)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one process on the GPU")
    ap.add_argument("--profile-step", type=int, default=0,
                    help="cuda: bracket step K (1-based) with cudaProfilerStart/Stop, for ncu --profile-from-start off")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--compare", help="bench_resnet_step's JSON output: print the ratios")
    ap.add_argument("--load", help="PyTorch's results from this earlier --out file (no timing)")
    args = ap.parse_args()
    if args.device == "cuda" and args.ranks != 1:
        ap.error("--device cuda runs one process (--ranks 1)")
    if args.threads == 0:
        args.threads = 2 if args.ranks == 1 else 1

    if args.load:
        with open(args.load) as f:
            result = json.load(f)
    else:
        import torch.multiprocessing as mp

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.spawn(worker, args=(args.ranks, args, queue), nprocs=args.ranks, join=True)
        times, peak, params, version, device_mib, between_steps_mib = queue.get()
        ms = [1e3 * t for t in times]
        result = {
            "peer": "pytorch_ddp_gloo" if args.ranks > 1 else "pytorch",
            "device": args.device,
            "torch": version,
            "model": "torchvision.models.resnet50(num_classes=10)",
            "parameters": params,
            "ranks": args.ranks,
            "threads_per_rank": args.threads,
            "image_size": args.image_size,
            "batch_per_rank": args.batch,
            "steps": len(ms),
            "median_ms": statistics.median(ms),
            "min_ms": min(ms),
            "images_per_s": args.batch * args.ranks / (statistics.median(ms) / 1e3),
            "peak_rss_mib_per_rank": peak,
        }
        if args.device == "cuda":
            result["peak_device_mib"] = device_mib
            if args.profile_step > 0:
                result["device_mib_between_steps"] = between_steps_mib
    print(json.dumps(result, indent=2))
    if args.out and not args.load:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    if args.compare:
        print_ratios(result, args.compare)


def print_ratios(torch_result, compare):
    """tessera's images per second over PyTorch's, and both peak memories."""
    with open(compare) as f:
        ours = json.load(f)
    for b in ours["benchmarks"]:
        if b.get("run_type") == "aggregate" or "images_per_s" not in b:
            continue
        ratio = b["images_per_s"] / torch_result["images_per_s"]
        peaks = [b[k] for k in sorted(b) if k.startswith("peak_rss_mib_rank")]
        print("%s: tessera %.1f images/s (median step %.1f ms), PyTorch %.1f (%.1f ms): %.2fx" % (
            b["name"], b["images_per_s"], b["median_ms"], torch_result["images_per_s"],
            torch_result["median_ms"], ratio))
        print("  peak memory per rank (MiB): tessera %s, PyTorch %s" % (
            ", ".join("%.0f" % p for p in peaks),
            ", ".join("%.0f" % p for p in torch_result["peak_rss_mib_per_rank"])))
        if "peak_device_mib" in b and "peak_device_mib" in torch_result:
            print("  peak GPU memory (MiB): tessera %.0f, PyTorch %.0f" % (
                b["peak_device_mib"], torch_result["peak_device_mib"]))


if __name__ == "__main__":
    main()
