"""Text output of the command line: one tcpdump-like line per packet, optional hex or scapy decode."""

from __future__ import annotations

from typing import TextIO


class Printer:
    """Prints packets as `fcap -i ...` (on a terminal) and `fcap -r` show them."""

    def __init__(self, args, out: TextIO):
        self.out = out
        self.hex = getattr(args, "hex", 0)
        self.hexascii = getattr(args, "hexascii", 0)
        self.decode = getattr(args, "verbose", 0) > 0
        self.precision = "nano" if getattr(args, "nano", False) else "micro"

    def packet(self, ts_ns: int, data: bytes, linktype: int, orig_len: int, point: str | None = None) -> None:
        """One packet's line (point, when given, after the timestamp), then its hex dump or scapy's decode."""
        from . import show
        parts = [show.summary(ts_ns, data, linktype, orig_len, point, precision=self.precision), "\n"]
        if self.hexascii:
            parts += [show.hexdump(data, ascii=True), "\n"]
        elif self.hex:
            parts += [show.hexdump(data, ascii=False), "\n"]
        if self.decode:
            try:
                parts += [show.scapy_decode(data, linktype), "\n"]
            except ImportError as e:  # said once: the next packets get their lines only
                parts += [f"  ({e})\n"]
                self.decode = False
        self.out.write("".join(parts))

    def flush(self) -> None:
        self.out.flush()
