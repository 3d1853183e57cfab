"""pcapy-ng's live API over kernel points, as `from fcap import pcapy` (fcap/__init__ gives this module under that
name): a script written for pcapy-ng runs unchanged with its import changed to
`from fcap import pcapy`, and a device name that is a capture point (`tp_btf/net_dev_queue`, `fentry/ip_output`,
`dev:queue`) opens that point through fcap.capture. Any other name, and the rest of pcapy (open_offline, compile,
findalldevs, the DLT_ constants, PcapError, ...), is pcapy-ng's own.

    from fcap import pcapy
    r = pcapy.open_live("tp_btf/net_dev_queue", 65535, 1, 100)
    r.setfilter("icmp")
    r.loop(10, lambda hdr, data: print(hdr.getts(), hdr.getlen()))
"""

from __future__ import annotations

import pcapy as _pcapy
from pcapy import *  # noqa: F401,F403 - the rest of pcapy-ng's API, as it is

from fcap.errors import FcapError

PcapError = _pcapy.PcapError
_DIRECTIONS = {_pcapy.PCAP_D_IN: "in", _pcapy.PCAP_D_OUT: "out", _pcapy.PCAP_D_INOUT: None}
_DLT_OF = {101: _pcapy.DLT_RAW}   # LINKTYPE_ values whose DLT_ differs (libpcap's linktype_to_dlt)


def is_point(device: str) -> bool:
    """Whether a device name names a capture point rather than an interface."""
    return isinstance(device, str) and ("/" in device or ":" in device)


def open_live(device: str, snaplen: int, promisc: int, to_ms: int):
    """A Reader of the capture point `device` (pcapy-ng's Reader for an interface). promisc means nothing at a
    kernel point; to_ms is how long next() and dispatch() wait for a packet (0: until one comes)."""
    if not is_point(device):
        return _pcapy.open_live(device, snaplen, promisc, to_ms)
    return Reader(device, snaplen, to_ms)


def create(device: str):
    """pcapy's create(): a point's Reader is active at once (activate() does nothing)."""
    if not is_point(device):
        return _pcapy.create(device)
    return Reader(device, 65535, 0)


class Pkthdr:
    """A packet's header as pcapy gives it: getts() (seconds, microseconds), getcaplen(), getlen()."""

    __slots__ = ("ts_ns", "caplen", "len")

    def __init__(self, ts_ns: int, caplen: int, length: int):
        self.ts_ns, self.caplen, self.len = ts_ns, caplen, length

    def getts(self) -> tuple[int, int]:
        sec, ns = divmod(self.ts_ns, 1_000_000_000)
        return sec, ns // 1000

    def getcaplen(self) -> int:
        return self.caplen

    def getlen(self) -> int:
        return self.len


class Reader:
    """pcapy-ng's live Reader at a capture point: the capture is running from open_live(); setfilter() and
    setdirection() restart it with the filter (compiled to eBPF, run in the kernel) or direction (-Q)."""

    def __init__(self, point: str, snaplen: int, to_ms: int):
        self.point, self.snaplen, self.to_ms = point, snaplen, to_ms
        self.filter: str | None = None
        self.direction: str | None = None
        self.nonblock = False
        self.cap = None
        self.seen = self.lost = 0   # (of the captures setfilter() closed)
        self._start()

    def _start(self) -> None:
        import fcap
        if self.cap is not None:
            _, seen, lost = self.cap.stats
            self.seen, self.lost = self.seen + seen, self.lost + lost
            self.cap.close()
            self.cap = None
        try:
            self.cap = fcap.capture(self.point, filter=self.filter, snaplen=self.snaplen or 262144,
                                    direction=self.direction)
        except FcapError as e:
            raise PcapError(str(e)) from None

    def _wait(self) -> float | None:
        if self.nonblock:
            return 0.0
        return self.to_ms / 1000 if self.to_ms > 0 else None

    def next(self):
        """(Pkthdr, bytes) of the next packet, or (None, b"") when the timeout passed with none."""
        p = self._packet(self._wait())
        return (None, b"") if p is None else p

    def _packet(self, timeout: float | None):
        if self.cap is None:
            raise PcapError("the capture is closed")
        p = self.cap.next(timeout)
        if p is None:
            return None
        return Pkthdr(p.ts_ns, len(p.data), p.orig_len), bytes(p.data)

    def loop(self, cnt: int, callback) -> None:
        """callback(header, data) for cnt packets (cnt <= 0: until the capture is closed)."""
        n = 0
        while cnt <= 0 or n < cnt:
            p = self._packet(None)
            if p is None:
                return
            callback(*p)
            n += 1

    def dispatch(self, cnt: int, callback) -> int:
        """callback(header, data) for the packets at hand (waiting for the first at most the timeout), at most cnt
        of them (cnt <= 0: all); how many."""
        n = 0
        timeout = self._wait()
        while cnt <= 0 or n < cnt:
            p = self._packet(timeout)
            if p is None:
                break
            callback(*p)
            n += 1
            timeout = 0.0
        return n

    def setfilter(self, expression: str) -> None:
        """tcpdump's expression, run in the kernel from now on (the capture restarts with it)."""
        self.filter = expression or None
        self._start()

    def setdirection(self, direction: int) -> None:
        if direction not in _DIRECTIONS:
            raise PcapError(f"setdirection: {direction} is not PCAP_D_IN, PCAP_D_OUT or PCAP_D_INOUT")
        self.direction = _DIRECTIONS[direction]
        self._start()

    def datalink(self) -> int:
        return _DLT_OF.get(self.cap.linktype, self.cap.linktype) if self.cap is not None else 0

    def stats(self) -> tuple[int, int, int]:
        """(received, dropped, dropped by the interface): packets the programs recorded, records the buffer had no
        room for, 0."""
        _, seen, lost = self.cap.stats if self.cap is not None else (0, 0, 0)
        return self.seen + seen, self.lost + lost, 0

    def dump_open(self, path: str) -> Dumper:
        return Dumper(path, self.cap.linktype, self.snaplen or 262144)

    def getnet(self) -> int:
        return 0

    def getmask(self) -> int:
        return 0

    def getfd(self) -> int:
        return -1

    def setnonblock(self, state: int) -> None:
        self.nonblock = bool(state)

    def getnonblock(self) -> int:
        return int(self.nonblock)

    def activate(self) -> int:
        return 0

    def set_snaplen(self, snaplen: int) -> int:
        self.snaplen = snaplen
        self._start()
        return 0

    def set_timeout(self, to_ms: int) -> int:
        self.to_ms = to_ms
        return 0

    def set_promisc(self, state: int) -> int:
        return 0

    def set_buffer_size(self, size: int) -> int:
        return 0

    def sendpacket(self, data: bytes) -> None:
        raise PcapError(f"sendpacket: {self.point} is a capture point; nothing can be sent there")

    def close(self) -> None:
        if self.cap is not None:
            self.cap.close()
            self.cap = None


class Dumper:
    """pcapy's Dumper: dump(header, data) writes a pcap record (the Reader's link type) into the file."""

    def __init__(self, path: str, linktype: int, snaplen: int):
        from fcap.files.pcapfile import PcapWriter
        self.file = open(path, "wb")
        self.writer = PcapWriter(self.file, linktype=linktype, snaplen=snaplen)

    def dump(self, header, data: bytes) -> None:
        ts_ns = header.ts_ns if isinstance(header, Pkthdr) else \
            header.getts()[0] * 1_000_000_000 + header.getts()[1] * 1000
        self.writer.write(ts_ns, data, header.getlen())

    def close(self) -> None:
        if self.file is not None:
            self.writer.flush()
            self.file.close()
            self.file = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

