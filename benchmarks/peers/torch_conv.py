#!/usr/bin/env python3
"""PyTorch peer of bench_conv: torch.nn.functional.conv2d forward and backward (dx and
dw, no bias) and batch_norm (training) + relu forward and backward, on ResNet-50's
CIFAR-10 shapes (batch 32, 32 x 32; the batch norms also at the 4 x 4 to 1 x 1 planes of
torchvision's ResNet-50 on 32 x 32 images), float32 NCHW tensors on the CPU, with
torch.set_num_threads(--threads) to match bench_conv's OMP_NUM_THREADS:

    OMP_NUM_THREADS=1 build/benchmarks/bench_conv --benchmark_repetitions=5 \\
        --benchmark_report_aggregates_only=true \\
        --benchmark_out=benchmarks/results/bench_conv_t1.json --benchmark_out_format=json
    /usr/bin/python3 benchmarks/peers/torch_conv.py --threads 1 \\
        --out benchmarks/results/torch_conv_t1.json \\
        --compare benchmarks/results/bench_conv_t1.json

Each case runs --rounds rounds of --iters iterations after a warm-up; a round's time is
its mean iteration, and the case's time the median round (milliseconds), as bench_conv's
median of repetitions. --compare reads bench_conv's JSON and prints, per case, PyTorch's
time over tessera's (above 1: tessera is faster) for each of tessera's forms, and
tessera's time over bench_conv's direct oneDNN peer (conv/<shape>/onednn), and for the
batch norms the split form's time too (bn_relu_split: what ResNet-50's batch norms run);
--filter REGEX times only the cases whose names it finds; with
--load, PyTorch's times come from an earlier --out file instead of being measured. Needs
Debian's python3-torch (apt-get install python3-torch); it is not a dependency of
tessera or of its tests.
"""

import argparse
import json
import re
import statistics
import time

CONV_CASES = [  # name, in, out, kernel, stride, size: as bench_conv.cpp
    ("3x3_3to64", 3, 64, 3, 1, 32),
    ("3x3_64to64", 64, 64, 3, 1, 32),
    ("1x1_256to64", 256, 64, 1, 1, 32),
    ("1x1_64to256", 64, 256, 1, 1, 32),
    ("3x3_128to128_s2", 128, 128, 3, 2, 32),
]
BN_CASES = [(64, 32), (256, 32), (512, 4), (1024, 2), (2048, 1)]  # channels, size: as bench_conv.cpp
BATCH = 32


def bn_name(c, size):
    return "bn_relu/%d" % c if size == 32 else "bn_relu/%d_%dx%d" % (c, size, size)


def time_case(step, iters, rounds, warmup):
    for _ in range(warmup):
        step()
    per_round = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        per_round.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(per_round), min(per_round)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", help="write the times here (JSON)")
    ap.add_argument("--compare", help="bench_conv's JSON output: print the ratios")
    ap.add_argument("--load", help="PyTorch's times from this earlier --out file (no timing)")
    ap.add_argument("--filter", default="", help="only the cases whose names this regular expression finds")
    args = ap.parse_args()
    if args.load:
        with open(args.load) as f:
            doc = json.load(f)
        print_ratios(doc["benchmarks"], args.compare)
        return

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    results = []

    wanted = re.compile(args.filter)
    for name, cin, cout, k, s, size in CONV_CASES:
        if not wanted.search("conv/" + name):
            continue
        x = torch.randn(BATCH, cin, size, size, requires_grad=True)
        w = torch.randn(cout, cin, k, k, requires_grad=True)
        with torch.no_grad():
            dy = torch.randn_like(F.conv2d(x, w, None, s, k // 2))

        def step(x=x, w=w, dy=dy, s=s, k=k):
            y = F.conv2d(x, w, None, s, k // 2)
            torch.autograd.grad(y, (x, w), dy)

        med, best = time_case(step, args.iters, args.rounds, args.warmup)
        results.append({"name": "conv/" + name, "median_ms": med, "min_ms": best})

    for c, size in BN_CASES:
        if not wanted.search(bn_name(c, size)):
            continue
        x = torch.randn(BATCH, c, size, size, requires_grad=True)
        gamma = (torch.rand(c) + 1.0).requires_grad_()
        beta = torch.randn(c, requires_grad=True)
        rm, rv = torch.zeros(c), torch.ones(c)
        dy = torch.randn(BATCH, c, size, size)

        def step(x=x, gamma=gamma, beta=beta, rm=rm, rv=rv, dy=dy):
            y = F.relu(F.batch_norm(x, rm, rv, gamma, beta, training=True, momentum=0.1, eps=1e-5))
            torch.autograd.grad(y, (x, gamma, beta), dy)

        med, best = time_case(step, args.iters, args.rounds, args.warmup)
        results.append({"name": bn_name(c, size), "median_ms": med, "min_ms": best})

    doc = {
        "context": {"torch": torch.__version__, "threads": torch.get_num_threads(), "batch": BATCH,
                    "iters": args.iters, "rounds": args.rounds, "mkldnn": torch.backends.mkldnn.is_available()},
        "benchmarks": results,
    }
    for r in results:
        print("%-28s %9.3f ms (min %.3f)" % (r["name"], r["median_ms"], r["min_ms"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")

    if args.compare:
        print_ratios(results, args.compare)


def print_ratios(results, compare):
    """PyTorch's median over tessera's, per case and form of bench_conv's JSON file."""
    with open(compare) as f:
        ours = json.load(f)
    tessera = {}
    for b in ours["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        name = re.sub(r"/(min_time:[^/]*|real_time|manual_time)", "", b.get("run_name", b["name"]))
        tessera[name] = b["real_time"] * scale
    print()
    print("%-22s %9s  %s" % ("case", "PyTorch", "tessera ms (PyTorch / tessera)"))
    for r in results:
        cells = []
        for form in ("plain", "blocked", "split"):
            if form == "split":  # the batch norms' split form
                if not r["name"].startswith("bn_relu/"):
                    continue
                key = r["name"].replace("bn_relu/", "bn_relu_split/", 1) + "/plain"
            else:
                key = r["name"] + "/" + form
            t = tessera.get(key)
            if t:
                cells.append("%-7s %7.2f (%.2fx)" % (form, t, r["median_ms"] / t))
        direct = tessera.get(r["name"] + "/onednn")
        if direct:
            cells.append("oneDNN direct %7.2f (tessera blocked / direct %.3f, plain / direct %.3f)" % (
                direct, tessera[r["name"] + "/blocked"] / direct, tessera[r["name"] + "/plain"] / direct))
        print("%-22s %9.2f  %s" % (r["name"], r["median_ms"], "   ".join(cells)))


if __name__ == "__main__":
    main()
