"""What every fcap subcommand does at the terminal's edge: one line on stderr for a failure, a quiet stdout after
the reader went away."""

from __future__ import annotations

import os
import sys

PROG = "fcap"


def fail(msg: str, code: int = 1) -> int:
    try:
        sys.stderr.write(f"{PROG}: {msg}\n")
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    return code


def quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except OSError:
        pass
