"""`fcap path FILE` and `fcap ... --path`: each packet's points in time order with the time between them, the device
and network namespace at each (with --stack the kernel stack there), and how it ended (dropped, with the reason and
where; consumed; or still in flight), then per-hop latency percentiles. Streams: records are put in time order
within a window, a packet's path is printed when it ends, and memory is what the packets in flight hold (and at
most HOLD_MAX records waiting)."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fcap.errors import FcapError
from fcap.features import comments
from fcap.kernel.drops import base_name, drops_every_packet
from fcap.live.output import PrintSink
from fcap.text.show import describe, format_time

WINDOW_NS = 1_000_000_000   # records may come out of time order by this much (per-CPU batches)
IDLE_NS = 10_000_000_000    # a packet not seen for this long (capture time) is reported as it stands
SAMPLE_MAX = 10_000         # latencies kept per hop (reservoir sampling past that)
HOLD_MAX = 100_000          # records held for reordering at most (at high rates the window is shorter)
CONSUME_POINTS = ("consume_skb", "skb:consume")
ADDRESS_IDS = 1 << 63       # packet ids from here up are skb addresses (files fcap wrote before packet ids)
# what tcpdump's lines (fcap.text.show) say of bytes that are not a whole packet where they are read
DAMAGE = ("bad-len", "bad-hlen", "[|", "[Invalid header", "truncated", "(invalid)")


class PathInputError(FcapError):
    """The input cannot give paths: the message says what `fcap path` needs."""


@dataclass
class Hop:
    """One record of a packet at a point."""

    ts_ns: int
    packet: int                # the packet id (fcap.kernel.track; files before it: the skb's address)
    point: str                 # the point's name (IDB name)
    ifindex: int | None = None
    netns: int | None = None
    drop: str | None = None    # "NO_SOCKET at __udp4_lib_rcv+0x4bc" at drop points
    line: str = ""             # the packet as tcpdump prints it (the path's title: its most complete one)
    stack: tuple | None = None   # --stack: the kernel stack's frames there, innermost first (() unknown)


def end_of(h: Hop) -> str | None:
    if h.drop is not None or drops_every_packet(h.point):
        return "dropped"
    if base_name(h.point) in CONSUME_POINTS or h.point in CONSUME_POINTS:
        return "consumed"
    return None


def title(hops: list[Hop]) -> str:
    """The packet as tcpdump prints it, from its most complete record: the first whose line shows no damage (at a
    function before the network header is set the bytes read as 'IP bad-len 0'), else the first."""
    return next((h.line for h in hops if not any(sign in h.line for sign in DAMAGE)), hops[0].line)


def place(h: Hop) -> tuple:
    """Where a hop is: (ifindex, netns), None each where the record does not say."""
    return h.ifindex, h.netns


def heading(h: Hop) -> str:
    """The line over the hops at one device and namespace: '-- ifindex 3, netns 4026532281 --', or '-- no device
    --' before the skb has one (the kernel's 0)."""
    if not h.ifindex and not h.netns:
        return "-- no device --"
    return "-- " + ", ".join(f"{k} {v}" for k, v in (("ifindex", h.ifindex), ("netns", h.netns)) if v is not None) + \
        " --"


@dataclass
class _Hops:
    hops: list[Hop] = field(default_factory=list)
    last: int = 0


class Reservoir:
    """At most SAMPLE_MAX values, a uniform sample of all seen (deterministic)."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self.n = 0
        self._rng = random.Random(1)

    def add(self, v: int) -> None:
        self.n += 1
        if len(self.values) < SAMPLE_MAX:
            self.values.append(v)
        else:
            i = self._rng.randrange(self.n)
            if i < SAMPLE_MAX:
                self.values[i] = v

    def percentile(self, q: float) -> int:
        s = sorted(self.values)   # nearest rank
        return s[max(0, math.ceil(q * len(s)) - 1)] if s else 0


class Tracker:
    """Feed hops (any order within WINDOW_NS); get each finished packet's text as it ends; finish() for the
    rest and the summary."""

    def __init__(self, window_ns: int = WINDOW_NS, idle_ns: int = IDLE_NS):
        self.window, self.idle = window_ns, idle_ns
        self.heap: list[tuple[int, int, Hop]] = []
        self.seq = 0
        self.newest = 0
        self.packets: dict[int, _Hops] = {}
        self.hops: dict[tuple[str, str], Reservoir] = {}
        self.ends = {"dropped": 0, "consumed": 0, "in flight": 0}
        self.reasons: dict[str, int] = {}
        self.last_sweep = 0

    def feed(self, hop: Hop) -> Iterator[str]:
        heapq.heappush(self.heap, (hop.ts_ns, self.seq, hop))
        self.seq += 1
        self.newest = max(self.newest, hop.ts_ns)
        while self.heap and (self.heap[0][0] <= self.newest - self.window or len(self.heap) > HOLD_MAX):
            yield from self._take(heapq.heappop(self.heap)[2])
        if self.newest - self.last_sweep > self.idle:
            self.last_sweep = self.newest
            yield from self._sweep(self.newest - self.idle)

    def finish(self) -> Iterator[str]:
        while self.heap:
            yield from self._take(heapq.heappop(self.heap)[2])
        for pid in list(self.packets):
            yield self._report(pid, "in flight at the end")
        yield self.summary()

    def _take(self, hop: Hop) -> Iterator[str]:
        pkt = self.packets.get(hop.packet)
        if pkt is not None and hop.packet >= ADDRESS_IDS and \
                any(h.point == hop.point and h.ifindex == hop.ifindex for h in pkt.hops):
            # the same point and device again: a new packet (files before packet ids: the kernel gave a freed
            # skb's address, their packet id, to a new packet). A packet id is the kernel's word: a packet passes
            # a function twice (nf_hook_slow at two hooks) and stays one.
            yield self._report(hop.packet, "end not seen")
            pkt = None
        if pkt is None:
            pkt = self.packets[hop.packet] = _Hops()
        pkt.hops.append(hop)
        pkt.last = hop.ts_ns
        end = end_of(hop)
        if end is not None:
            yield self._report(hop.packet, end)

    def _sweep(self, before: int) -> Iterator[str]:
        for pid in [pid for pid, p in self.packets.items() if p.last < before]:
            yield self._report(pid, "in flight (not seen again)")

    def _report(self, pid: int, end: str) -> str:
        hops = self.packets.pop(pid).hops
        first = hops[0]
        out = [f"packet {pid:#x}: {title(hops)}".rstrip()]
        if len(hops) > 1:
            out.append(f"  {len(hops)} points in {hops[-1].ts_ns - first.ts_ns} ns")
        prev = None
        for h in hops:
            if place(h) != (None, None) and (prev is None or place(h) != place(prev)):
                out.append(f"  {heading(h)}")   # where the device or the namespace changes
            when = format_time(h.ts_ns, "nano") if prev is None else f"+{h.ts_ns - prev.ts_ns} ns"
            out.append(f"  {when:>18}  {h.point}")
            if h.stack is not None:
                out += [f"{'':>22}{frame}" for frame in h.stack or ("(stack unknown)",)]
            if prev is not None:
                self.hops.setdefault((prev.point, h.point), Reservoir()).add(h.ts_ns - prev.ts_ns)
            prev = h
        last = hops[-1]
        kind = end.split(" ", 1)[0] if end in ("dropped", "consumed") else "in flight"
        self.ends[kind] += 1
        if end == "dropped":
            why = last.drop or "(no reason recorded)"
            self.reasons[why] = self.reasons.get(why, 0) + 1
            out.append(f"  dropped: {why}")
        else:
            out.append(f"  {end}")
        return "\n".join(out) + "\n"

    def summary(self) -> str:
        n = sum(self.ends.values())
        e = self.ends
        lines = [f"{n} packet{'s' if n != 1 else ''}: {e['dropped']} dropped, {e['consumed']} consumed, "
                 f"{e['in flight']} in flight"]
        if self.hops:
            width = max(len(f"{a} -> {b}") for a, b in self.hops)
            lines.append(f"{'hop':<{width}}  {'n':>8}  {'p50 ns':>10}  {'p99 ns':>10}")
            for (a, b), r in sorted(self.hops.items(), key=lambda kv: -kv[1].n):
                lines.append(f"{a + ' -> ' + b:<{width}}  {r.n:>8}  {r.percentile(0.5):>10}  {r.percentile(0.99):>10}")
        for why, k in sorted(self.reasons.items(), key=lambda kv: -kv[1]):
            lines.append(f"dropped {k}: {why}")
        return "\n".join(lines) + "\n"


# ---- live: fcap ... --path -----------------------------------------------------------------------------------

class PathSink(PrintSink):
    """--path's output: each record a hop of its packet's path; a path is printed (on the printer's stream) when it
    ends, the rest and the summary when the capture does."""

    def __init__(self, printer, tracker: Tracker | None = None):
        super().__init__(printer)
        self.tracker = tracker or Tracker()

    def open(self, session) -> None:
        super().open(session)
        from fcap.features.drop_reason import drop_names
        self.points = {p.id: p for p in session.points}
        self.drops = drop_names(session.points)

    def write(self, rec) -> None:
        session = self.session
        p = self.points[rec.point]
        drop = self.drops.describe(rec) if self.drops is not None else None
        hop = Hop(rec.ts_ns + session.clock_offset_ns, rec.id, p.alias or p.spec, rec.ifindex, rec.netns, drop,
                  describe(rec.data, session.linktype.number, rec.orig_len), rec.stack)
        for text in self.tracker.feed(hop):
            self.printer.out.write(text)

    def close(self, ok: bool = True) -> None:
        self.printer.out.write("".join(self.tracker.finish()))
        self.printer.flush()


# ---- from a file fcap wrote --------------------------------------------------------------------------------

def hops_of_file(path: str, stacks: bool = False) -> Iterator[Hop]:
    """The hops in a pcapng file fcap wrote (PathInputError, one line, for anything else); `stacks`: with the
    kernel stacks the file carries (fcap --stack)."""
    from fcap.files.pcapfile import PCAP_MAGIC_KUZNETZOV, PCAP_MAGIC_NS, PCAP_MAGIC_US
    from fcap.files.pcapread import read
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise PathInputError(f"{path}: {e.strerror}") from None
    pcap = {m.to_bytes(4, o) for m in (PCAP_MAGIC_US, PCAP_MAGIC_NS, PCAP_MAGIC_KUZNETZOV) for o in ("little", "big")}
    if head in pcap:
        raise PathInputError(f"{path}: a pcap file has no packet ids or points; fcap path needs the pcapng file fcap "
                        f"writes (fcap -i POINT ... -w FILE.pcapng)")
    fcap_records = 0
    for rec in read(path):   # (fcap's comment, or none: --no-comment)
        if rec.packet_id is None or not (rec.comment is None or rec.comment.startswith("skb=0x")):
            if fcap_records == 0:
                raise PathInputError(f"{path}: its packets carry no fcap packet ids and comments; fcap path needs a "
                                f"pcapng file fcap wrote (fcap -i POINT ... -w FILE.pcapng)")
            continue
        fcap_records += 1
        yield _hop_of_record(rec, stacks)


def _hop_of_record(rec, stacks: bool = False) -> Hop:
    meta = comments.of_text(rec.comment)
    reason, location = meta.get("reason"), meta.get("location")
    drop = None   # (a drop's comment always names the location; the reason where the kernel gives one)
    if location is not None:
        drop = f"{reason} at {location}" if reason is not None else f"at {location}"
    return Hop(rec.ts_ns, rec.packet_id, rec.iface_name or f"interface {rec.iface}", meta.get("ifindex"),
               meta.get("netns"), drop, describe(rec.data, rec.linktype, rec.orig_len),
               meta.get("stack") if stacks else None)


def report(hops: Iterable[Hop], write) -> None:
    """Write each packet's path as it ends, then the rest and the summary."""
    t = Tracker()
    for hop in hops:
        for text in t.feed(hop):
            write(text)
    for text in t.finish():
        write(text)
