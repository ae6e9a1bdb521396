#!/usr/bin/env python3
"""Charts of the benchmarks' JSON under benchmarks/results/, for docs/benchmarks.md.

    python3 tools/plot_benchmarks.py [--results benchmarks/results] [--out benchmarks/results]

Writes, under --out:
  bench_search_time.png        each search's time to a strategy against the graph's
                               operators (bench_search.json), one panel per device count;
  bench_mnist_step_vs_ddp.png  seed 002's data-parallel step, tessera's variants beside
                               PyTorch DDP's (bench_mnist_step_np2.json, ddp_mnist_np2.json);
  bench_resnet_step_vs_pytorch.png
                               ResNet-50's training step, images per second of tessera and
                               of PyTorch in the same session, on CPUs (resnet_step_*_np*.json)
                               and on one H200 (resnet_step_cuda_*_h200.json and
                               torch_resnet_step_cuda_*_h200.json).

Uses matplotlib (Debian: python3-matplotlib), which building and testing tessera do not
need; tools/plot_matmul.py draws bench_matmul's charts.
"""

import argparse
import json
import os
import re
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_benchmarks: matplotlib is needed (Debian: python3-matplotlib)")


def load(results, name):
    with open(os.path.join(results, name), encoding="utf-8") as f:
        return json.load(f)


def search_time(results, out):
    runs = {}  # devices -> search -> [(operators, seconds, graph)]
    for b in load(results, "bench_search.json")["benchmarks"]:
        m = re.match(r"search/([^/]+)/devices=(\d+)/([a-z_]+)/", b["name"])
        if not m or "search_s" not in b or m.group(3) == "data_parallel":
            continue
        runs.setdefault(int(m.group(2)), {}).setdefault(m.group(3), []).append(
            (b["operators"], b["search_s"], m.group(1)))
    devices = sorted(runs)
    colour = {"recursive_programming": "tab:blue", "sharding_propagation": "tab:green",
              "dynamic_programming": "tab:red"}
    fig, axes = plt.subplots(1, len(devices), figsize=(4.2 * len(devices), 3.8), sharey=True)
    for ax, d in zip(axes, devices):
        for search, points in sorted(runs[d].items()):
            stack = sorted(p for p in points if p[2].startswith("transformer"))
            resnet = [p for p in points if p[2] == "resnet50"]
            c = colour.get(search, "black")
            ax.plot([p[0] for p in stack], [p[1] for p in stack], marker="o", color=c,
                    label=search.replace("_", " ") + ", transformers")
            ax.plot([p[0] for p in resnet], [p[1] for p in resnet], marker="s", linestyle="none", color=c,
                    markerfacecolor="none", label=search.replace("_", " ") + ", ResNet-50")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{d} devices")
        ax.set_xlabel("operators in the graph")
    axes[0].set_ylabel("search time (s)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Time to a strategy (bench_search: transformer stacks and ResNet-50; dashed: 1 s)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench_search_time.png"), dpi=110)
    plt.close(fig)


def mnist_step(results, out):
    labels = {
        "mnist_step/data_parallel/iterations:300/manual_time": "tessera, defaults",
        "mnist_step/data_parallel/one_bucket/iterations:300/manual_time": "tessera, one bucket",
        "mnist_step/data_parallel/bucket=256KiB/iterations:300/manual_time": "tessera, 256 KiB buckets",
        "mnist_step/data_parallel/no_overlap/iterations:300/manual_time": "tessera, no overlap",
        "mnist_step/compute_only/iterations:300/manual_time": "tessera, no reduction",
    }
    bars = [(labels[b["name"]], b["median_ms"]) for b in load(results, "bench_mnist_step_np2.json")["benchmarks"]
            if b["name"] in labels]
    ddp = load(results, "ddp_mnist_np2.json")
    bars.append((f"PyTorch {ddp['torch'].split('a')[0]} DDP (gloo)", ddp["median_ms"]))
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.barh([b[0] for b in bars], [b[1] for b in bars],
            color=["tab:blue"] * (len(bars) - 1) + ["tab:orange"])
    for i, (_, v) in enumerate(bars):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median step (ms), slowest rank")
    ax.set_title("Seed 002's MLP, data parallel, 2 ranks, 32 samples each")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench_mnist_step_vs_ddp.png"), dpi=110)
    plt.close(fig)


def resnet_step(results, out):
    rows = []
    for size in (32, 224):
        for ranks, threads in ((1, 2), (2, 1)):
            name = f"resnet_step_{size}_np{ranks}_t{threads}.json"
            if os.path.exists(os.path.join(results, name)):
                m = load(results, name)["median"]
                rows.append((f"CPU {size}x{size}, {ranks} proc.", m["tessera_images_per_s"], m["pytorch_images_per_s"]))
        t_name, p_name = f"resnet_step_cuda_{size}_h200.json", f"torch_resnet_step_cuda_{size}_h200.json"
        if os.path.exists(os.path.join(results, t_name)) and os.path.exists(os.path.join(results, p_name)):
            t = next(b for b in load(results, t_name)["benchmarks"] if b["name"].startswith("resnet50_step/"))
            rows.append((f"H200 {size}x{size}", t["images_per_s"], load(results, p_name)["images_per_s"]))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ratios = [t / p for _, t, p in rows]
    ax.barh([r[0] for r in rows], ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
    for i, (x, (_, t, p)) in enumerate(zip(ratios, rows)):
        ax.text(x, i, f" {x:.2f}x ({t:.0f} / {p:.0f} img/s)" if t >= 10 else f" {x:.2f}x ({t:.2f} / {p:.2f} img/s)",
                va="center", fontsize=8)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(ratios) * 1.6)
    ax.set_xlabel("tessera's images per second / PyTorch's")
    ax.set_title("ResNet-50's training step, batch 32 per process")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench_resnet_step_vs_pytorch.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="benchmarks/results")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    for draw in (search_time, mnist_step, resnet_step):
        draw(a.results, a.out)
    print(f"plot_benchmarks: wrote 3 charts under {a.out}")


if __name__ == "__main__":
    main()
