#!/usr/bin/env python3
"""Tests of tessera-run, the job launcher, with test_worker as the program.

Usage: test_launcher.py LAUNCHER WORKER WORK_DIR CASE

Each CASE (a function below named case_<CASE>) runs the launcher in a fresh
WORK_DIR/<CASE> and checks its exit status, its output, the per-rank logs and that
no worker outlives it. Exits 0 when the case passes, 1 (with the reasons) when not.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LAUNCHER = WORKER = WORK = None
VARIABLES = ["TESSERA_LOCAL_RANK", "TESSERA_LOCAL_WORLD_SIZE", "TESSERA_MASTER_ADDR", "TESSERA_MASTER_PORT",
             "TESSERA_NODE_RANK", "TESSERA_RANK", "TESSERA_RESTART_COUNT", "TESSERA_WORLD_SIZE"]
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what)
    return condition


class Run:
    def __init__(self, proc, elapsed):
        self.status = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.elapsed = elapsed

    def show(self):
        print(f"status {self.status}, {self.elapsed:.2f} s\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}---")


def launch(args, worker_args=(), env=None, timeout=20):
    """Runs the launcher with test_worker and `worker_args`; returns a Run."""
    cmd = [LAUNCHER] + list(args)
    if worker_args is not None:
        cmd += ["--", WORKER] + list(worker_args)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=WORK, capture_output=True, text=True, timeout=timeout, env=env)
    run = Run(proc, time.monotonic() - start)
    run.show()
    return run


def log(rank, attempt=1, log_dir="log_output"):
    path = WORK / log_dir / str(attempt) / f"rank.{rank}" / "stdout"
    check(path.is_file(), f"the log {path} exists")
    return path.read_text() if path.is_file() else ""


def variables(text, rank):
    """The TESSERA_* variables rank `rank` printed."""
    out = {}
    for m in re.finditer(rf"^rank {rank}: (TESSERA_[A-Z_]+)=(.*)$", text, re.M):
        out[m.group(1)] = m.group(2)
    return out


def pid_dir():
    d = WORK / "pids"
    d.mkdir(exist_ok=True)
    return d


def alive(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def check_no_worker_left(count):
    pids = [int(p.read_text()) for p in sorted(pid_dir().glob("*.pid"))]
    check(len(pids) == count, f"{count} workers wrote their pid, found {len(pids)}")
    left = [p for p in pids if alive(p)]
    check(not left, f"no worker is left running (found {left})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the cases ------------------------------------------------------------------------

def case_env():
    """4 workers: ranks 0..3 with exactly the launcher's variables; logs at
    log_output/1/rank.N/stdout with stdout and stderr; rank 0's lines on the
    launcher's stdout; a big output and a last line with no newline kept whole."""
    # The launcher's own values of the 8 names are replaced; other variables pass.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env.update(TESSERA_RANK="99", TESSERA_RESTART_COUNT="7", TESSERA_OTHER="kept")
    r = launch(["--worker-num", "4"], ["--lines", "1", "20000", "--partial", "-1", "no newline"], env=env)
    check(r.status == 0, "the job exits 0")
    ports = set()
    for rank in range(4):
        text = log(rank)
        v = variables(text, rank)
        check(sorted(v) == sorted(VARIABLES + ["TESSERA_OTHER"]), f"rank {rank} has the 8 variables: {sorted(v)}")
        check(v.get("TESSERA_OTHER") == "kept", f"rank {rank}: the launcher's other variables pass")
        expected = {"TESSERA_RANK": str(rank), "TESSERA_WORLD_SIZE": "4", "TESSERA_LOCAL_RANK": str(rank),
                    "TESSERA_LOCAL_WORLD_SIZE": "4", "TESSERA_NODE_RANK": "0",
                    "TESSERA_MASTER_ADDR": "127.0.0.1", "TESSERA_RESTART_COUNT": "0"}
        for k, x in expected.items():
            check(v.get(k) == x, f"rank {rank}: {k}={x} (got {v.get(k)})")
        ports.add(v.get("TESSERA_MASTER_PORT"))
        check(f"rank {rank}: to stderr\n" in text, f"rank {rank}'s stderr is in its log")
        check(text.endswith(f"rank {rank}: done\nno newline"), f"rank {rank}'s log ends with its unfinished line")
    check(len(ports) == 1 and ports.pop().isdigit(), "every rank has the same master port, a number")
    lines = log(1).splitlines()
    check(all(f"rank 1: line {k}" in lines for k in (0, 1, 9999, 19999)), "rank 1's 20000 lines are in its log")
    check(sum(1 for l in lines if l.startswith("rank 1: line ")) == 20000, "exactly 20000 lines")
    check("rank 0: TESSERA_RANK=0\n" in r.stdout, "rank 0's lines are on the launcher's stdout")
    check("rank 0: to stderr\n" in r.stdout, "rank 0's stderr is on the launcher's stdout")
    check(r.stdout.endswith("rank 0: done\nno newline"), "the launcher's stdout ends with rank 0's unfinished line")
    check("rank 1:" not in r.stdout, "other ranks' lines are not on the launcher's stdout")
    # --log-dir and --master-port, --name=value form.
    r = launch(["--worker-num=2", "--log-dir=other logs", "--master-port", "23456", "--master-addr", "10.1.2.3"], [])
    check(r.status == 0, "the job exits 0")
    v = variables(log(1, log_dir="other logs"), 1)
    check(v.get("TESSERA_MASTER_PORT") == "23456" and v.get("TESSERA_MASTER_ADDR") == "10.1.2.3",
          f"--master-addr and --master-port reach the workers: {v}")


def case_failure():
    """Rank 2 exits 3: the job ends with status 3 within 5 s, names rank 2, shows its
    last lines, and no worker is left."""
    r = launch(["--worker-num", "4"],
               ["--pid-dir", str(pid_dir()), "--delay", "0.3", "--exit", "2", "3", "--sleep", "30"])
    check(r.status == 3, f"the launcher's status is rank 2's, 3 (got {r.status})")
    check("tessera-run: rank 2 exited with status 3" in r.stderr, "the message names rank 2 and its status")
    check("    rank 2: exiting with 3" in r.stderr, "rank 2's last lines are shown")
    check("rank 2: to stderr" in r.stderr, "its last lines include its stderr")
    check(r.elapsed < 5, f"the job ends within 5 s (took {r.elapsed:.2f} s)")
    check_no_worker_left(4)
    check("rank 0: done" not in log(0), "rank 0 was stopped")


def case_signal():
    """Rank 1 kills itself with SIGKILL: the job ends with 137 and names the signal."""
    r = launch(["--worker-num", "4"],
               ["--pid-dir", str(pid_dir()), "--delay", "0.3", "--kill", "1", "--sleep", "30"])
    check(r.status == 137, f"status 128 + 9 (got {r.status})")
    check("tessera-run: rank 1 was killed by signal 9 (SIGKILL)" in r.stderr, "the message names rank 1 and SIGKILL")
    check("    rank 1: killing itself" in r.stderr, "rank 1's last line is shown")
    check(r.elapsed < 5, f"the job ends within 5 s (took {r.elapsed:.2f} s)")
    check_no_worker_left(4)


def case_term_ignored():
    """Workers that ignore SIGTERM are killed after the grace period, within 5 s."""
    r = launch(["--worker-num", "4"],
               ["--pid-dir", str(pid_dir()), "--ignore-term", "-1", "--delay", "0.3", "--exit", "0", "1",
                "--sleep", "30"])
    check(r.status == 1, f"rank 0's status, 1 (got {r.status})")
    check("tessera-run: rank 0 exited with status 1" in r.stderr, "the message names rank 0")
    check(2.5 < r.elapsed < 5, f"the job ends after the grace period, within 5 s (took {r.elapsed:.2f} s)")
    check_no_worker_left(4)
    # A shorter grace period.
    shutil.rmtree(pid_dir())
    r = launch(["--worker-num", "2", "--stop-grace", "0.2"],
               ["--pid-dir", str(pid_dir()), "--ignore-term", "-1", "--delay", "0.3", "--exit", "0", "1",
                "--sleep", "30"])
    check(r.status == 1 and r.elapsed < 2, f"--stop-grace 0.2 ends the job sooner (took {r.elapsed:.2f} s)")
    check_no_worker_left(2)


def case_restart():
    """--max-restarts 1: rank 1 fails on the first attempt only, the restart succeeds
    (TESSERA_RESTART_COUNT 1, logs of attempt 2 beside those of attempt 1); a rank that
    always fails ends the job after the restarts are spent."""
    r = launch(["--worker-num", "3", "--max-restarts", "1"], ["--delay", "0.2", "--exit-first", "1", "4", "--sleep", "0.5"])
    check(r.status == 0, f"the restarted job exits 0 (got {r.status})")
    check("tessera-run: rank 1 exited with status 4" in r.stderr, "the first failure is named")
    check("tessera-run: restart 1 of 1" in r.stderr, "the restart is announced")
    check(r.stderr.count("restart ") == 1, "one restart")
    check("rank 1: exiting with 4" in log(1, attempt=1), "attempt 1's log keeps the failure")
    for rank in range(3):
        v = variables(log(rank, attempt=2), rank)
        check(v.get("TESSERA_RESTART_COUNT") == "1", f"rank {rank} sees TESSERA_RESTART_COUNT=1: {v}")
        check(variables(log(rank, attempt=1), rank).get("TESSERA_RESTART_COUNT") == "0", "attempt 1 saw 0")
    check(r.stdout.count("rank 0: TESSERA_RANK=0") == 2, "rank 0's output of both attempts is shown")

    shutil.rmtree(WORK / "log_output")
    r = launch(["--worker-num", "2", "--max-restarts", "2"], ["--exit", "1", "5"])
    check(r.status == 5, f"a job failing every time ends with the rank's status (got {r.status})")
    check(r.stderr.count("exited with status 5") == 3, "three attempts failed")
    check("restart 2 of 2" in r.stderr and "restart 3" not in r.stderr, "two restarts")
    check(variables(log(1, attempt=3), 1).get("TESSERA_RESTART_COUNT") == "2", "the last attempt saw 2")


def case_two_nodes():
    """Two launchers started by hand, --node-rank 0 and 1 with 2 workers each, give
    ranks 0..3 with their node and local ranks."""
    port = str(free_port())
    common = ["--worker-num", "4", "--local-worker-num", "2", "--master-port", port]
    procs = [subprocess.Popen([LAUNCHER] + common + ["--node-rank", str(n), WORKER], cwd=WORK,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    outs = [p.communicate(timeout=20) for p in procs]
    for n, (p, (out, err)) in enumerate(zip(procs, outs)):
        print(f"node {n}: status {p.returncode}\n--- stdout\n{out}--- stderr\n{err}---")
        check(p.returncode == 0, f"node {n} exits 0")
        first = 2 * n
        check(f"rank {first}: TESSERA_RANK={first}" in out, f"node {n} shows its first worker, rank {first}")
    for rank in range(4):
        v = variables(log(rank), rank)
        expected = {"TESSERA_RANK": str(rank), "TESSERA_WORLD_SIZE": "4", "TESSERA_LOCAL_RANK": str(rank % 2),
                    "TESSERA_LOCAL_WORLD_SIZE": "2", "TESSERA_NODE_RANK": str(rank // 2),
                    "TESSERA_MASTER_PORT": port, "TESSERA_MASTER_ADDR": "127.0.0.1"}
        for k, x in expected.items():
            check(v.get(k) == x, f"rank {rank}: {k}={x} (got {v.get(k)})")


def case_interrupt():
    """SIGTERM to the launcher reaches the workers; it exits with 128 + 15 and none is left."""
    proc = subprocess.Popen([LAUNCHER, "--worker-num", "3", WORKER, "--pid-dir", str(pid_dir()), "--sleep", "30"],
                            cwd=WORK, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while len(list(pid_dir().glob("*.pid"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    elapsed = time.monotonic() - start
    print(f"status {proc.returncode}, {elapsed:.2f} s\n--- stdout\n{out}--- stderr\n{err}---")
    check(proc.returncode == 143, f"status 128 + 15 (got {proc.returncode})")
    check("signal 15 (SIGTERM)" in err, "the signal is named")
    check(elapsed < 2, f"the workers stop at once (took {elapsed:.2f} s)")
    check_no_worker_left(3)

    # A launcher killed with SIGKILL takes its workers with it (PR_SET_PDEATHSIG).
    shutil.rmtree(pid_dir())
    proc = subprocess.Popen([LAUNCHER, "--worker-num", "2", WORKER, "--pid-dir", str(pid_dir()), "--sleep", "30"],
                            cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while len(list(pid_dir().glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.kill()
    proc.wait(timeout=10)
    pids = [int(p.read_text()) for p in pid_dir().glob("*.pid")]
    deadline = time.monotonic() + 2
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    check(len(pids) == 2 and not any(alive(p) for p in pids), "no worker outlives a launcher killed by SIGKILL")


def case_bad_options():
    """Each bad command line: a clear message naming the option and the numbers, and a
    non-zero status; a program that cannot be run: 127 (126), no worker started."""
    cases = [
        ([], None, 2, "--worker-num is required"),
        (["--worker-num", "2"], None, 2, "no program to run"),
        (["--worker-num", "2", "--bogus", "1"], [], 2, "unknown option --bogus"),
        (["--worker-num", "0"], [], 2, "--worker-num 0 is out of range"),
        (["--worker-num", "abc"], [], 2, "--worker-num expects an integer, got \"abc\""),
        (["--worker-num", "4x"], [], 2, "--worker-num expects an integer, got \"4x\""),
        (["--worker-num"], None, 2, "--worker-num needs a value"),
        (["--worker-num", "4", "--local-worker-num", "3"], [], 2,
         "--worker-num 4 is not a multiple of --local-worker-num 3"),
        (["--worker-num", "4", "--local-worker-num", "2", "--node-rank", "2", "--master-port", "1234"], [], 2,
         "--node-rank 2 is out of range: --worker-num 4 / --local-worker-num 2 gives 2 nodes (0 to 1)"),
        (["--worker-num", "4", "--local-worker-num", "2", "--node-rank", "1"], [], 2,
         "--master-port is required on node 1"),
        (["--worker-num", "2", "--master-port", "70000"], [], 2, "--master-port 70000 is out of range"),
        (["--worker-num", "2", "--max-restarts", "-1"], [], 2, "--max-restarts -1 is out of range"),
        (["--worker-num", "2", "--stop-grace", "soon"], [], 2, "--stop-grace expects a number of seconds"),
    ]
    for args, worker_args, status, message in cases:
        r = launch(args, worker_args)
        check(r.status == status, f"{args}: status {status} (got {r.status})")
        check(message in r.stderr, f"{args}: the message says \"{message}\"")
    r = launch(["--help"], None)
    check(r.status == 0 and "TESSERA_RESTART_COUNT" in r.stdout and "--max-restarts" in r.stdout, "--help")

    r = launch(["--worker-num", "3", "--", str(WORK / "no-such-program"), "x"], None)
    check(r.status == 127, f"a missing program: 127 (got {r.status})")
    check(f"cannot execute \"{WORK / 'no-such-program'}\": No such file or directory" in r.stderr,
          "the message names the program")
    r = launch(["--worker-num", "3", "no-such-program-on-the-path"], None)
    check(r.status == 127 and "no-such-program-on-the-path" in r.stderr, "a program not on the PATH: 127")
    text = WORK / "not-executable"
    text.write_text("data\n")
    r = launch(["--worker-num", "3", str(text)], None)
    check(r.status == 126 and "Permission denied" in r.stderr, "a file that is not executable: 126")
    # The log folder cannot be made: a clear error, status 1.
    (WORK / "a-file").write_text("")
    r = launch(["--worker-num", "2", "--log-dir", str(WORK / "a-file")], [])
    check(r.status == 1 and "cannot create the log folder" in r.stderr, "a log folder that cannot be made: 1")


def main():
    global LAUNCHER, WORKER, WORK
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    LAUNCHER, WORKER = sys.argv[1], sys.argv[2]
    WORK = Path(sys.argv[3]) / sys.argv[4]
    case = globals().get("case_" + sys.argv[4])
    if case is None:
        print(f"test_launcher.py: no case {sys.argv[4]}")
        return 2
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    case()
    if failures:
        print(f"{len(failures)} checks failed:\n  " + "\n  ".join(failures))
        return 1
    print("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
