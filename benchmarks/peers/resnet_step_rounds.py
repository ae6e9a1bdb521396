#!/usr/bin/env python3
"""bench_resnet_step and its PyTorch peer (torch_resnet_step.py) in alternating rounds,
one configuration: a round runs tessera's step, then PyTorch's, with the same image
size, processes, threads per process and steps. On a shared machine whose speed drifts
by 20% over minutes, a ratio from one pair of runs can be taken across such a drift;
the median over rounds of each round's ratio is not moved by one. Writes every round's
figures and the medians as JSON (--out) and prints them:

    /usr/bin/python3 benchmarks/peers/resnet_step_rounds.py --image-size 32 --ranks 1 --threads 2 \\
        --rounds 5 --out benchmarks/results/resnet_step_32_np1_t2.json
    /usr/bin/python3 benchmarks/peers/resnet_step_rounds.py --image-size 32 --ranks 2 --threads 1 \\
        --rounds 5 --out benchmarks/results/resnet_step_32_np2_t1.json

ratio = PyTorch's median step / tessera's (above 1: tessera is faster); memory is each
side's largest peak resident memory over its ranks, in MiB. Runs under the build folder's
benchmarks/bench_resnet_step (--bench), ranks > 1 under mpiexec.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def require_program(path):
    """Stops with the command that builds benchmark program `path` when it is missing:
    the default build only checks that the benchmarks compile."""
    if not os.path.isfile(path):
        name = os.path.basename(path)
        raise SystemExit("%s: no program %s; build it with `cmake --build build --target %s`"
                         % (os.path.basename(sys.argv[0]), path, name))


def host_cpu():
    """The CPU's model and widest vector extension (oneDNN's kernels and blocked layouts
    differ between AVX2 and AVX-512 hosts, and so do the ratios), from /proc/cpuinfo."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    return {"model": model, "isa": isa, "cores": os.cpu_count()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bench", default="build/benchmarks/bench_resnet_step")
    ap.add_argument("--out", help="write every round and the medians here (JSON)")
    args = ap.parse_args()

    require_program(args.bench)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    common = ["--image-size", str(args.image_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = os.path.join(tmp, "tessera.json"), os.path.join(tmp, "torch.json")
        for k in range(args.rounds):
            cmd = [args.bench] + common + ["--benchmark_out=" + ours, "--benchmark_out_format=json"]
            if args.ranks > 1:
                cmd = ["mpiexec", "-n", str(args.ranks), "--bind-to", "none"] + cmd
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            subprocess.run([sys.executable, os.path.join(here, "torch_resnet_step.py"), "--ranks", str(args.ranks),
                            "--threads", str(args.threads), "--out", theirs] + common,
                           env=env, check=True, stdout=subprocess.DEVNULL)
            with open(ours) as f:
                t = json.load(f)["benchmarks"][0]
            with open(theirs) as f:
                p = json.load(f)
            r = {
                "tessera_median_ms": t["median_ms"],
                "pytorch_median_ms": p["median_ms"],
                "ratio": p["median_ms"] / t["median_ms"],
                "tessera_peak_rss_mib": t["peak_rss_mib"],
                "pytorch_peak_rss_mib": max(p["peak_rss_mib_per_rank"]),
            }
            rounds.append(r)
            print("round %d: tessera %.1f ms, PyTorch %.1f ms: %.3f; peak memory %.0f and %.0f MiB" % (
                k + 1, r["tessera_median_ms"], r["pytorch_median_ms"], r["ratio"], r["tessera_peak_rss_mib"],
                r["pytorch_peak_rss_mib"]), flush=True)
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    batch = 32 * args.ranks
    med["tessera_images_per_s"] = batch / (med["tessera_median_ms"] / 1e3)
    med["pytorch_images_per_s"] = batch / (med["pytorch_median_ms"] / 1e3)
    print("median over %d rounds: ratio %.3f (%.3f to %.3f); tessera %.1f images/s, PyTorch %.1f; "
          "peak memory %.0f and %.0f MiB" % (
              len(rounds), med["ratio"], min(r["ratio"] for r in rounds), max(r["ratio"] for r in rounds),
              med["tessera_images_per_s"], med["pytorch_images_per_s"], med["tessera_peak_rss_mib"],
              med["pytorch_peak_rss_mib"]))
    if args.out:
        doc = {"context": {"image_size": args.image_size, "ranks": args.ranks, "threads_per_rank": args.threads,
                           "batch_per_rank": 32, "steps": args.steps, "warmup": args.warmup,
                           "date": time.strftime("%Y-%m-%d"), "cpu": host_cpu(),
                           "tessera": "bench_resnet_step (nn::resnet50, train::model, Momentum(0.01, 0.9))",
                           "pytorch": "torch_resnet_step.py (torchvision resnet50, SGD(0.01, momentum 0.9)" +
                                      (", DDP over gloo)" if args.ranks > 1 else ")")},
               "rounds": rounds, "median": med}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
