"""A scapy socket at a kernel capture point: scapy's sniff() reads any point as it reads an interface,

    from scapy.all import sniff
    from fcap.scapysock import PointSocket
    sniff(opened_socket=PointSocket("tp_btf/net_dev_queue", filter="icmp"), count=10, prn=lambda p: p.summary())

each packet decoded by scapy from its link type (Packet.scapy()), with its time (`opened_socket={sock: NAME}`
makes NAME each packet's sniffed_on). The filter runs in the kernel (fcap.capture's); the capture's other keywords
(where, pid, direction, ...) pass through."""

from __future__ import annotations

import time

from scapy.supersocket import SuperSocket

POLL_S = 0.05   # how long select() waits at most per call: sniff's stop() and timeout are seen that soon


class PointSocket(SuperSocket):
    desc = "a kernel capture point (fcap)"
    nonblocking_socket = True   # (sniff polls select() below; there is no file descriptor to wait on)

    def __init__(self, point: str, filter: str | None = None, **capture):   # noqa: A002 - scapy's own word
        import fcap
        self.point = point
        self.cap = fcap.capture(point, filter=filter, **capture)
        self.held = None
        self.closed = False
        self.ins = self.outs = None
        self.iface = point

    def recv(self, x: int = 0, **kw):
        """The next packet as scapy decodes it; None when none is at hand. EOFError: the capture is over."""
        p, self.held = self.held or self.cap.next(0), None
        if p is None:
            if self.cap.closed:
                raise EOFError
            return None
        pkt = p.scapy()
        pkt.time = p.ts_ns / 1e9
        return pkt

    def send(self, x) -> int:
        raise OSError(f"{self.point} is a capture point: nothing can be sent there")

    @staticmethod
    def select(sockets, remain=None):
        """The sockets with a packet at hand (or whose capture is over), waiting at most `remain` (and POLL_S)."""
        deadline = time.monotonic() + min(remain if remain is not None else POLL_S, POLL_S)
        while True:
            for s in sockets:
                if s.held is None and not s.cap.closed:
                    s.held = s.cap.next(0)
            ready = [s for s in sockets if s.held is not None or s.cap.closed]
            left = deadline - time.monotonic()
            if ready or left <= 0:
                return ready
            sockets[0].held = sockets[0].cap.next(left)   # (wait on the first; the others are looked at again)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.cap.close()
