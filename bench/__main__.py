"""python -m bench [--quick]: fcap against tcpdump on the same loopback flood; rewrites BENCHMARKS.md's tables."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from . import capture, levers, suite
from .traffic import BenchError

REPORT, HISTORY = "BENCHMARKS.md", "BENCHMARKS-HISTORY.md"   # the current report; the levers and earlier runs


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer packets and runs: under two minutes")
    ap.add_argument("--out", help="the report (default: BENCHMARKS.md; --levers: BENCHMARKS-HISTORY.md)")
    ap.add_argument("--no-write", action="store_true", help="print the report, leave BENCHMARKS.md alone")
    ap.add_argument("--json", metavar="FILE", help="also write every run's numbers as JSON")
    ap.add_argument("--only", choices=suite.PARTS, action="append",
                    help="run only these parts (repeatable; implies --no-write)")
    ap.add_argument("--fcap", metavar="CMD", help="run fcap as CMD (e.g. 'env PYTHONPATH=/tmp/old python3 -m "
                    "fcap.commands.cli', to measure another version; implies --no-write)")
    ap.add_argument("--dir", default=capture.OUT_DIR[0],
                    help="where the capture files go (default /dev/shm: no disk; a disk file system's page cache "
                    "costs each tool differently per byte)")
    ap.add_argument("--disk-dir", default="/var/tmp",
                    help="where the disk part's files go (default /var/tmp: a disk file system on most machines)")
    ap.add_argument("--levers", action="store_true",
                    help="measure fcap as of each fast-path lever's commit (bench/levers.py) and rewrite that table")
    return ap


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("bench: needs root (tcpdump and fcap capture)", file=sys.stderr)
        return 2
    if args.fcap:
        capture.FCAP[:] = shlex.split(args.fcap)
        args.no_write = True
    args.out = args.out or os.path.join(suite.ROOT, HISTORY if args.levers else REPORT)
    capture.OUT_DIR[0] = args.dir
    suite.compile_checkout()
    try:
        return (levers.run if args.levers else suite.run)(args, _log)
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
