"""Captures read back by Wireshark's tshark (the tests that use it skip when it is not installed)."""

from __future__ import annotations

import subprocess


def no_error_text(text: str) -> str:
    """stderr of tcpdump/tshark without the lines that are not about the file (tshark's root warning,
    tcpdump's 'reading from file' banner)."""
    skip = ("Running as user", "reading from file", "This could be dangerous")
    return "\n".join(ln for ln in text.splitlines() if ln.strip() and not any(s in ln for s in skip))


def tshark_rows(path, *fields: str) -> list[list[str]]:
    """Wireshark's reading of a capture file: one row of FIELDS per packet (tshark -T fields); tshark must
    succeed and say nothing about the file on stderr."""
    r = subprocess.run(["tshark", "-r", str(path), "-T", "fields", *(a for f in fields for a in ("-e", f))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not no_error_text(r.stderr), r.stderr
    return [ln.split("\t") for ln in r.stdout.splitlines()]
