#!/usr/bin/env python3
"""Charts of bench_matmul's JSON output (Google Benchmark --benchmark_out).

    python3 tools/plot_matmul.py benchmarks/results/bench_matmul_np2.json \
        benchmarks/results/bench_matmul_np8.json [--out benchmarks/results] [--size 4096]

Writes, under --out:
  bench_matmul_gflops.png      GFLOP/s of every strategy (plain, overlapped, SUMMA) and
                               of the peers (psgemm per grid, one process with P
                               threads), one panel per rank count, one bar per size;
  bench_matmul_comm_share.png  time per strategy split into computing and exposed
                               communication, the plain run beside the pipelined one,
                               at one size (--size, default the largest in each file),
                               with the hidden share of communication above each pair.

Uses matplotlib (Debian: python3-matplotlib) when it can be imported, else gnuplot
(Debian: gnuplot-nox); neither is needed to build or test tessera. The rank count of a
file is read from its blas_single benchmark (P threads) or from "_np<P>" in its name.
Standard library only besides the plotting program.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

NAME = re.compile(
    r"^(?P<kind>tessera_overlapped|tessera_summa|tessera|scalapack|blas_single)/"
    r"(?P<what>\(\(.*?\)\)|\d+x\d+/nb=\w+|\d+ threads)/(?P<n>\d+)(?:/chunks=(?P<chunks>\d+))?/")


def load(path):
    """The runs of one JSON file as dicts: kind, label, n, counters; and its rank count."""
    with open(path) as f:
        data = json.load(f)
    runs, ranks = [], None
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        m = NAME.match(b["name"])
        if not m:
            continue
        kind, what, n = m.group("kind"), m.group("what"), int(m.group("n"))
        if kind == "blas_single":
            ranks = int(b.get("threads", what.split()[0]))
        runs.append({"kind": kind, "what": what, "n": n, "chunks": m.group("chunks"), "b": b})
    if ranks is None:
        found = re.search(r"_np(\d+)", os.path.basename(path))
        if not found:
            sys.exit(f"plot_matmul: {path}: no blas_single run and no _np<P> in the name: rank count unknown")
        ranks = int(found.group(1))
    return runs, ranks


def label(run):
    kind, what = run["kind"], run["what"]
    if kind == "tessera":
        return what
    if kind == "tessera_overlapped":
        return what + " overlapped"
    if kind == "tessera_summa":
        return what + " SUMMA"
    if kind == "scalapack":
        return "psgemm " + what.split("/")[0]
    return "sgemm " + what


def gflops_table(runs):
    """{label: {n: GFLOP/s}}: the fastest round (--rounds), psgemm's best block size per grid."""
    table = {}
    for r in runs:
        g = r["b"].get("gflops", 0.0)
        row = table.setdefault(label(r), {})
        row[r["n"]] = max(row.get(r["n"], 0.0), g)
    return table


def comm_rows(runs, size):
    """Per pipelined strategy at `size` (its fastest round, --rounds): (label, plain
    compute, plain comm, pipelined compute, exposed comm, hidden fraction), in ms."""
    fastest = {}
    for r in runs:
        if r["n"] != size or r["kind"] not in ("tessera_overlapped", "tessera_summa"):
            continue
        key = (label(r), r["chunks"])
        if key not in fastest or r["b"]["real_time"] < fastest[key]["b"]["real_time"]:
            fastest[key] = r
    rows = []
    for (name, chunks), r in fastest.items():
        b = r["b"]
        rows.append((name, b["plain_compute_ms"], b["plain_comm_ms"], b["compute_ms"], b["comm_ms"],
                     b["hidden_comm_fraction"]))
    return rows


def plot_matplotlib(files, out, size_arg):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(files), 1, figsize=(13, 4.2 * len(files)), squeeze=False)
    for ax, (path, (runs, ranks)) in zip(axes[:, 0], files.items()):
        table = gflops_table(runs)
        labels = list(table)
        sizes = sorted({n for row in table.values() for n in row})
        width = 0.8 / max(1, len(sizes))
        for i, n in enumerate(sizes):
            xs = [j + (i - (len(sizes) - 1) / 2) * width for j in range(len(labels))]
            ax.bar(xs, [table[l].get(n, 0.0) for l in labels], width, label=f"n = {n}")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("GFLOP/s (all ranks)")
        note = " (oversubscribed: 2 cores)" if ranks > (os.cpu_count() or ranks) else ""
        ax.set_title(f"C = A x B, fp32, {ranks} ranks{note}")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench_matmul_gflops.png"), dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(len(files), 1, figsize=(12, 3.8 * len(files)), squeeze=False)
    for ax, (path, (runs, ranks)) in zip(axes[:, 0], files.items()):
        size = size_arg or max(r["n"] for r in runs)
        rows = comm_rows(runs, size)
        for j, (name, pc, pm, c, e, hidden) in enumerate(rows):
            ax.bar(j - 0.2, pc, 0.38, color="tab:blue", label="compute" if j == 0 else None)
            ax.bar(j - 0.2, pm, 0.38, bottom=pc, color="tab:red", label="communication" if j == 0 else None)
            ax.bar(j + 0.2, c, 0.38, color="tab:blue", hatch="//")
            ax.bar(j + 0.2, e, 0.38, bottom=c, color="tab:red", hatch="//")
            ax.text(j, max(pc + pm, c + e) * 1.02, f"hidden {hidden:.0%}", ha="center", fontsize=8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r[0] for r in rows], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("ms (slowest rank)")
        ax.set_title(f"{ranks} ranks, n = {size}: plain (left) vs pipelined (right, hatched); "
                     "communication = time beyond the products")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bench_matmul_comm_share.png"), dpi=110)
    plt.close(fig)


def plot_gnuplot(files, out, size_arg):
    gp = shutil.which("gnuplot")
    if not gp:
        sys.exit("plot_matmul: neither matplotlib (python3-matplotlib) nor gnuplot (gnuplot-nox) is available")
    with tempfile.TemporaryDirectory() as tmp:
        script = ["set terminal png size 1300,%d" % (420 * len(files)),
                  "set output '%s'" % os.path.join(out, "bench_matmul_gflops.png"),
                  "set multiplot layout %d,1" % len(files), "set style data histograms",
                  "set style histogram clustered", "set style fill solid", "set xtics rotate by -35 font ',8'",
                  "set ylabel 'GFLOP/s (all ranks)'", "set grid ytics"]
        for i, (path, (runs, ranks)) in enumerate(files.items()):
            table = gflops_table(runs)
            sizes = sorted({n for row in table.values() for n in row})
            dat = os.path.join(tmp, f"g{i}.dat")
            with open(dat, "w") as f:
                f.write("label " + " ".join(f"n{n}" for n in sizes) + "\n")
                for l, row in table.items():
                    f.write('"%s" ' % l + " ".join(str(row.get(n, 0.0)) for n in sizes) + "\n")
            cols = ", ".join(f"'{dat}' using {k + 2}:xtic(1) title 'n = {n}'" for k, n in enumerate(sizes))
            script += [f"set title 'C = A x B, fp32, {ranks} ranks'", "plot " + cols]
        script += ["unset multiplot", "set terminal png size 1200,%d" % (380 * len(files)),
                   "set output '%s'" % os.path.join(out, "bench_matmul_comm_share.png"),
                   "set multiplot layout %d,1" % len(files), "set style histogram rowstacked",
                   "set ylabel 'ms (slowest rank)'"]
        for i, (path, (runs, ranks)) in enumerate(files.items()):
            size = size_arg or max(r["n"] for r in runs)
            dat = os.path.join(tmp, f"c{i}.dat")
            with open(dat, "w") as f:
                for name, pc, pm, c, e, hidden in comm_rows(runs, size):
                    f.write('"%s plain" %g %g\n' % (name, pc, pm))
                    f.write('"pipelined, hidden %.0f%%" %g %g\n' % (100 * hidden, c, e))
            script += [f"set title '{ranks} ranks, n = {size}: compute and communication'",
                       f"plot '{dat}' using 2:xtic(1) title 'compute', '' using 3 title 'communication'"]
        script.append("unset multiplot")
        subprocess.run([gp], input="\n".join(script), text=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="bench_matmul --benchmark_out files")
    ap.add_argument("--out", default="benchmarks/results", help="folder of the PNG files")
    ap.add_argument("--size", type=int, default=0, help="n of the communication chart (default: largest)")
    args = ap.parse_args()
    files = {}
    for path in args.json:
        runs, ranks = load(path)
        if not runs:
            sys.exit(f"plot_matmul: {path}: no bench_matmul runs in it")
        files[path] = (runs, ranks)
    files = dict(sorted(files.items(), key=lambda kv: kv[1][1]))
    os.makedirs(args.out, exist_ok=True)
    try:
        import matplotlib  # noqa: F401
        plot_matplotlib(files, args.out, args.size)
    except ImportError:
        plot_gnuplot(files, args.out, args.size)
    for name in ("bench_matmul_gflops.png", "bench_matmul_comm_share.png"):
        print(os.path.join(args.out, name))


if __name__ == "__main__":
    main()
