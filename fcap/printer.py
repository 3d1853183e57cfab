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
        self.dump_compact = getattr(args, "dump_style", None) == "compact"
        self.dump_zeroes = getattr(args, "dump_zeroes", False)

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

    def dumps(self, dumps) -> None:
        """A packet's --dump values (fcap.dumps.Dump) under its line, each line indented by two spaces."""
        text = "\n".join(d.line(self.dump_compact, self.dump_zeroes) for d in dumps)
        self.out.write("  " + text.replace("\n", "\n  ") + "\n")

    def flush(self) -> None:
        self.out.flush()
