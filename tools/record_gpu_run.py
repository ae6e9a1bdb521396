#!/usr/bin/env python3
"""Records which GPU tests ran, and how they ended, in docs/gpu_run.json: the record from
which tools/gen_docs.py draws the GPU column of the README's feature table.

Usage, on a machine with a GPU, after building the suite into build/:
    ctest --test-dir build -L gpu --output-junit gpu.xml
    python3 tools/record_gpu_run.py build/gpu.xml [--device NAME] [--software TEXT]
    python3 tools/gen_docs.py

ctest writes the JUnit file relative to the build folder. Each test of the file replaces
that test's entry (status, date, device); tests the run did not include keep theirs, so a
session that reran a few tests records those and keeps the rest. A test that ctest skipped
(exit code 77: no GPU) is recorded as skipped, which the feature table shows as built, not
tested. The device and software default to what nvidia-smi reports.
"""
import argparse
import datetime
import json
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs/gpu_run.json"


def nvidia_smi(query):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    return lines[0] if lines else None


def results(junit):
    """{test name: passed | failed | skipped} from a ctest --output-junit file."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as e:
        raise SystemExit(f"record_gpu_run: {junit}: not a JUnit file ctest wrote ({e})")
    out = {}
    for case in root.iter("testcase"):
        name = case.get("name")
        if not name:
            raise SystemExit(f"record_gpu_run: {junit}: a testcase without a name")
        if case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail":
            out[name] = "failed"
        elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            out[name] = "skipped"
        else:
            out[name] = "passed"
    if not out:
        raise SystemExit(f"record_gpu_run: {junit} holds no test")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", help="the file `ctest --output-junit` wrote")
    ap.add_argument("--device", help="the GPU, e.g. 'one NVIDIA H100 80GB HBM3' (default: nvidia-smi's name)")
    ap.add_argument("--software", help="driver and CUDA versions (default: nvidia-smi's driver)")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--out", default=str(RECORD), help="the record to update (default: docs/gpu_run.json)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    device = args.device or nvidia_smi("name")
    if not device:
        raise SystemExit("record_gpu_run: no --device given and nvidia-smi names no GPU")
    software = args.software or f"driver {nvidia_smi('driver_version') or 'unknown'}"
    record = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {"tests": {}}
    ran = results(args.junit)
    for name, status in ran.items():
        record["tests"][name] = {"status": status, "date": args.date, "device": device, "software": software}
    record["tests"] = dict(sorted(record["tests"].items()))
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    counts = {s: sum(1 for v in ran.values() if v == s) for s in ("passed", "failed", "skipped")}
    print(f"record_gpu_run: {len(ran)} tests on {device}: {counts['passed']} passed, "
          f"{counts['failed']} failed, {counts['skipped']} skipped; wrote {out}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
