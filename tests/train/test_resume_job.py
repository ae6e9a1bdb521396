#!/usr/bin/env python3
"""A job killed and restarted by tessera-run --max-restarts resumes from its newest
complete checkpoint and ends with the uninterrupted job's parameters, bit for bit.

Usage: test_resume_job.py LAUNCHER WORKER WORK_DIR WORKERS

Three jobs of resume_worker on WORKERS ranks: uninterrupted; one whose last rank is
killed after step 6 (after that step's checkpoint), restarted once; one whose last
rank is killed while the others save step 6 (that checkpoint left incomplete, so the
restart resumes from step 5 and takes step 6 again). Every step's loss, in either
attempt, and the final digest of the parameters must be the uninterrupted job's, and
the restarted jobs must name the checkpoint they resumed from. Exits 0 when all hold.
"""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path


def job(launcher, worker, work, name, workers, extra, restarts):
    d = work / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    cmd = [launcher, "--worker-num", str(workers), "--log-dir", str(d / "logs"), "--max-restarts", str(restarts),
           "--", worker, "--dir", str(d / "ckpt")] + extra
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    print(f"--- {name}: status {p.returncode}, {time.monotonic() - start:.1f} s\n{out}")
    final = re.search(r"^final ([0-9a-f]{16}) loss (\S+)$", out, re.M)
    resumed = re.search(r"^resuming from (\S+)$", out, re.M)
    steps = [(int(m.group(1)), m.group(2)) for m in re.finditer(r"^step (\d+) loss (\S+)$", out, re.M)]
    return p.returncode, final.groups() if final else None, resumed.group(1) if resumed else None, steps


def main():
    launcher, worker, work, workers = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    last = str(workers - 1)
    failures = []
    status, whole, _, whole_steps = job(launcher, worker, work, "uninterrupted", workers, [], 0)
    if status != 0 or not whole:
        failures.append("the uninterrupted job did not finish")
    expected_losses = dict(whole_steps)
    if sorted(expected_losses) != list(range(1, 13)):
        failures.append(f"the uninterrupted job printed the losses of steps {sorted(expected_losses)}, not 1 to 12")
    cases = [("killed", ["--die-at", "6", "--die-rank", last], "net-2_2.safetensors"),
             ("killed_in_save", ["--die-at", "6", "--die-rank", last, "--in-save"], "net-2_1.safetensors")]
    for name, extra, expected in cases:
        status, final, resumed, steps = job(launcher, worker, work, name, workers, extra, 1)
        if sorted(set(step for step, _ in steps)) != list(range(1, 13)):
            failures.append(f"{name}: losses printed for steps {sorted(set(s for s, _ in steps))}, not 1 to 12")
        for step, loss in steps:  # both attempts' (a step after the restart's checkpoint is taken again)
            if expected_losses.get(step) != loss:
                failures.append(f"{name}: step {step}'s loss {loss}, the uninterrupted job's {expected_losses.get(step)}")
        if status != 0:
            failures.append(f"{name}: the restarted job exited with {status}")
        if resumed != expected:
            failures.append(f"{name}: resumed from {resumed}, expected {expected}")
        if not final or final != whole:
            failures.append(f"{name}: final {final}, the uninterrupted job's {whole}")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
