"""The packet being printed: bounds-checked big-endian reads up to tcpdump's snapend, the output, the protocol, and
the headers decoded on the way (the layers --json writes)."""

from __future__ import annotations

import socket

M32 = 0xFFFFFFFF
_inet_ntop, _AF_INET6 = socket.inet_ntop, socket.AF_INET6


class Truncated(Exception):
    """The packet ends before a field a printer needs: tcpdump prints " [|proto]" (and args[0] after it).
    soft: tcpdump's printer said so and returned, so the link-layer header length it had counted stands (-x,
    -A dump what follows it); otherwise tcpdump jumped out of its printers and dumps the whole packet."""

    def __init__(self, *args: object, soft: bool = False, said: bool = False) -> None:
        super().__init__(*args)
        self.soft, self.said = soft, said   # said: the printer has printed " [|proto]" itself


class PrintState:
    """Bytes being printed, how far reading is allowed (tcpdump's snapend), the protocol being printed, output,
    the relative TCP sequence numbers' table (None: absolute numbers), whether the link-level header is printed
    (tcpdump -e), the link-level header's length as tcpdump counts it (what -x and -A leave out), whether
    the bytes of unknown protocols go unprinted (-x, -X: the whole packet is dumped), and the layers: each
    header's fields by layer name ("link", "ip", "tcp", "udp", "icmp", "icmp6", "arp"), as far as the bytes go,
    the outermost of each (a tunnel's inner packet and an error's quoted one are printed, not recorded), and how
verbose the lines are (tcpdump's -v count: the IP headers' fields, checksums, an ICMP error's quoted packet)
and whether IP's, TCP's and UDP's checksums are checked then (checks: -v without -K; ICMP's always are)."""

    __slots__ = ("b", "checks", "eflag", "end", "hdr", "layers", "out", "proto", "recording", "seqs", "suppress",
                 "verbose")

    def __init__(self, data: bytes, seqs: dict | None, eflag: bool = False, suppress: bool = False,
                 verbose: int = 0, checksums: bool = True) -> None:
        self.b, self.end, self.out, self.proto, self.seqs = data, len(data), [], "", seqs
        self.eflag, self.hdr, self.suppress, self.verbose = eflag, 0, suppress, verbose
        self.checks = bool(verbose) and checksums   # (-v checks IP's, TCP's and UDP's checksums, but with -K)
        self.layers: dict[str, dict] = {}
        self.recording = True

    def layer(self, name: str, **fields) -> dict:
        """Record a header's fields under its layer name (the first such header only); the dict to add to."""
        if not self.recording or name in self.layers:
            return {}
        self.layers[name] = fields
        return fields

    def default_print(self, off: int, n: int, ascii: bool = True, unless_suppressed: bool = False) -> None:
        """tcpdump's ND_DEFAULTPRINT (ascii: n bytes from off in hex and ASCII, on lines of their own; what was not
        captured of them ends the packet as truncated) or print_unknown_data (in hex, what was captured).
        unless_suppressed: where tcpdump prints them only without -x or -X (the packet is dumped then anyway)."""
        if unless_suppressed and self.suppress:
            return
        data = self.b[off:min(off + n, self.end)]
        if data:
            self.out.append("\n" + hex_lines(data, ascii))
        if ascii and off + n > self.end:
            raise Truncated

    def need(self, off: int, n: int, soft: bool = False) -> None:
        """Raise Truncated unless n bytes from off were captured (soft: see Truncated)."""
        if off + n > self.end:
            raise Truncated(soft=soft)

    # (the reads check the bounds themselves, as need() would: they run a few dozen times a packet)
    def u8(self, off: int) -> int:
        if off + 1 > self.end:
            raise Truncated
        return self.b[off]

    def u16(self, off: int) -> int:
        if off + 2 > self.end:
            raise Truncated
        b = self.b
        return b[off] << 8 | b[off + 1]

    def u32(self, off: int) -> int:
        if off + 4 > self.end:
            raise Truncated
        return int.from_bytes(self.b[off:off + 4], "big")

    def ip4(self, off: int) -> str:
        if off + 4 > self.end:
            raise Truncated
        return "%d.%d.%d.%d" % tuple(self.b[off:off + 4])

    def ip6(self, off: int) -> str:
        if off + 16 > self.end:
            raise Truncated
        return _inet_ntop(_AF_INET6, self.b[off:off + 16])

    def mac(self, off: int, n: int = 6) -> str:
        if off + n > self.end:
            raise Truncated
        return self.b[off:off + n].hex(":")

    def add(self, text: str) -> None:
        self.out.append(text)


def hex_lines(data: bytes, ascii: bool = False) -> str:
    """tcpdump -x (ascii=False) or -X (ascii=True) lines, "\\t0x0000:  4500 0054 ...  E..T", newline-joined."""
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        hexpart = "".join(" " + chunk[i:i + 2].hex() for i in range(0, len(chunk), 2))
        if ascii:
            text = "".join(chr(c) if 0x21 <= c <= 0x7E else "." for c in chunk)
            lines.append(f"\t0x{off:04x}: {hexpart:<40}  {text}")
        else:
            lines.append(f"\t0x{off:04x}: {hexpart}")
    return "\n".join(lines)
