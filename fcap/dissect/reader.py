"""The packet being printed: bounds-checked big-endian reads up to tcpdump's snapend, the output, the protocol."""

from __future__ import annotations

import socket

M32 = 0xFFFFFFFF


class Truncated(Exception):
    """The packet ends before a field a printer needs: tcpdump prints " [|proto]" (and args[0] after it)."""


class Packet:
    """Bytes being printed, how far reading is allowed (tcpdump's snapend), the protocol being printed, output,
    and the relative TCP sequence numbers' table (None: absolute numbers)."""

    __slots__ = ("b", "end", "out", "proto", "seqs")

    def __init__(self, data: bytes, seqs: dict | None) -> None:
        self.b, self.end, self.out, self.proto, self.seqs = data, len(data), [], "", seqs

    def need(self, off: int, n: int) -> None:
        if off + n > self.end:
            raise Truncated

    def u8(self, off: int) -> int:
        self.need(off, 1)
        return self.b[off]

    def u16(self, off: int) -> int:
        self.need(off, 2)
        return self.b[off] << 8 | self.b[off + 1]

    def u32(self, off: int) -> int:
        self.need(off, 4)
        return int.from_bytes(self.b[off:off + 4], "big")

    def ip4(self, off: int) -> str:
        self.need(off, 4)
        return "%d.%d.%d.%d" % tuple(self.b[off:off + 4])

    def ip6(self, off: int) -> str:
        self.need(off, 16)
        return socket.inet_ntop(socket.AF_INET6, self.b[off:off + 16])

    def mac(self, off: int, n: int = 6) -> str:
        self.need(off, n)
        return ":".join("%02x" % c for c in self.b[off:off + n])

    def add(self, text: str) -> None:
        self.out.append(text)
