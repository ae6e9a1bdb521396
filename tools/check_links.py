#!/usr/bin/env python3
"""Checks that the Markdown files of the repository point to files that exist.

Usage:
    python3 tools/check_links.py     exit 1, naming each one, if a link is broken

Read: README.md, CHANGELOG.md and every docs/**/*.md. Checked: each Markdown link or
image whose target is relative ([text](path), ![alt](path); an anchor after '#' is
ignored), relative to the file's folder; and each path in backticks that starts with a
top-level folder of the repository (`benchmarks/results/bench_search.json`), relative
to the repository root. Fenced code blocks are skipped; paths with placeholders
(<name>, *, ...) are not checked.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOP = ("include", "tests", "benchmarks", "examples", "docs", "tools", "scripts", "cmake", "single_include")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^(?:%s)/[A-Za-z0-9_./-]+$" % "|".join(TOP))


def files():
    for name in ("README.md", "CHANGELOG.md"):
        if (ROOT / name).exists():
            yield ROOT / name
    yield from sorted((ROOT / "docs").rglob("*.md")) if (ROOT / "docs").exists() else []


def broken(md):
    out = []
    fenced = False
    for number, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        prose = CODE.sub("", line)
        for target in LINK.findall(prose):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = (md.parent / target.split("#")[0]).resolve()
            if not path.exists():
                out.append(f"{md.relative_to(ROOT)}:{number}: link to {target}: no such file")
        for token in CODE.findall(line):
            token = token.rstrip(".,;:")
            if PATH.match(token) and not (ROOT / token).exists():
                out.append(f"{md.relative_to(ROOT)}:{number}: path `{token}`: no such file")
    return out


def main():
    problems = [p for md in files() for p in broken(md)]
    for p in problems:
        print(p)
    if problems:
        print(f"check_links: {len(problems)} broken")
        return 1
    print(f"check_links: every link of {len(list(files()))} files points to a file that exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
