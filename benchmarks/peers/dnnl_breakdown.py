#!/usr/bin/env python3
"""Where the host's ResNet-50 step spends its time in oneDNN: runs bench_resnet_step with
oneDNN's execution log on (DNNL_VERBOSE=2, ONEDNN_VERBOSE=2), splits the log into steps
at each execution of the network's first convolution, drops the warm-up steps, and sums
the rest by primitive: the convolutions by pass, and the reorders by what they move
(weights: a layout that blocks dim 0, the output channels, as OIhw16i16o does;
activations: the others, NCHW to and from nChw16c). Prints a table per step and writes
it as JSON (--out):

    /usr/bin/python3 benchmarks/peers/dnnl_breakdown.py --image-size 32 --threads 2 \\
        --out benchmarks/results/resnet_step_32_dnnl_breakdown_t2.json

Each figure is the mean over the timed steps, in milliseconds, beside the benchmark's own
median step (the log's writes slow the step it measures a little). Runs under the build
folder's benchmarks/bench_resnet_step (--bench), on one process.
"""

import argparse
import collections
import json
import os
import subprocess
import tempfile
import time

from resnet_step_rounds import host_cpu, require_program


def parse(lines):
    """The log's executions as (kind, pass, src and dst tags, shape, ms)."""
    out = []
    for line in lines:
        f = line.strip().split(",")
        if "exec" not in f[:3]:
            continue
        i = f.index("exec")
        # exec, engine, kind, implementation, pass, memory descriptors, attributes,
        # auxiliary, shape, milliseconds (oneDNN 2.x; 3.x puts a timestamp first).
        kind, prop, mds, shape = f[i + 2], f[i + 4], f[i + 5], f[i + 8]
        tags = [md.split(":")[3] for md in mds.split(" ") if md.count(":") >= 3]
        out.append((kind, prop, tags, shape, float(f[-1])))
    return out


def is_weights(tags):
    """A reorder of weights: one of its layouts blocks dim 0 (the output channels), which
    activations' layouts (abcd, aBcd16b, acdb) never do."""
    return any("A" in t for t in tags)


def breakdown(execs, warmup):
    """Mean milliseconds per timed step by category, and the number of timed steps."""
    first = next((i for i, e in enumerate(execs) if e[0] == "convolution"), None)
    if first is None:
        raise SystemExit("dnnl_breakdown: the log holds no convolution (is the benchmark built with oneDNN?)")
    marker = (execs[first][0], execs[first][1], execs[first][3])
    starts = [i for i, e in enumerate(execs) if (e[0], e[1], e[3]) == marker]
    timed = starts[warmup:]
    if not timed:
        raise SystemExit("dnnl_breakdown: the log holds %d steps, none after %d warm-up steps" % (len(starts), warmup))
    sums = collections.Counter()
    for e in execs[timed[0]:]:
        kind, prop, tags, _, ms = e
        if kind == "reorder":
            key = "reorder_weights" if is_weights(tags) else "reorder_activations"
        elif kind == "convolution":
            key = "convolution_" + prop.replace("_training", "")
        else:
            key = kind.replace("_v2", "")
        sums[key] += ms
    steps = len(timed)
    return {k: v / steps for k, v in sorted(sums.items())}, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bench", default="build/benchmarks/bench_resnet_step")
    ap.add_argument("--out", help="write the table here (JSON)")
    args = ap.parse_args()

    require_program(args.bench)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), DNNL_VERBOSE="2", ONEDNN_VERBOSE="2")
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "tessera.json")
        cmd = [args.bench, "--image-size", str(args.image_size), "--steps", str(args.steps), "--warmup",
               str(args.warmup), "--benchmark_out=" + result, "--benchmark_out_format=json"]
        run = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0:
            raise SystemExit("dnnl_breakdown: %s failed (%d):\n%s" % (" ".join(cmd), run.returncode, run.stderr))
        log = run.stdout
        with open(result) as f:
            step_ms = json.load(f)["benchmarks"][0]["median_ms"]
    version = next((l.split(",")[-1].strip() for l in log.splitlines() if ",info,oneDNN" in l), "unknown")
    per_step, steps = breakdown(parse(log.splitlines()), args.warmup)
    total = sum(per_step.values())
    print("%d timed steps of %dx%d images, %d threads, %s; the benchmark's median step %.1f ms" % (
        steps, args.image_size, args.image_size, args.threads, version, step_ms))
    for k, v in per_step.items():
        print("  %-30s %8.1f ms  %5.1f%% of the step" % (k, v, 100 * v / step_ms))
    print("  %-30s %8.1f ms  %5.1f%% of the step" % ("all of oneDNN", total, 100 * total / step_ms))
    if args.out:
        doc = {"context": {"image_size": args.image_size, "threads": args.threads, "batch": 32,
                           "steps": args.steps, "warmup": args.warmup, "onednn": version,
                           "date": time.strftime("%Y-%m-%d"), "cpu": host_cpu(),
                           "tessera": "bench_resnet_step (nn::resnet50, train::model, Momentum(0.01, 0.9))"},
               "step_ms": step_ms, "onednn_ms_per_step": per_step, "onednn_total_ms_per_step": total}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
