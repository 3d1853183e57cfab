"""The Python API: fcap.capture(...) (a context manager and iterator of fcap.Packet, detached on leaving, on an
exception and on garbage collection) and fcap.read(path) (the same Packets from files fcap wrote)."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Iterator

from fcap.defaults import FILE_BATCH, POLL_MS, SNAPLEN
from fcap.errors import FcapError, PcapFormatError, UsageError
from fcap.features import comments
from fcap.live.output import PacketSink, file_packet
from fcap.packet import Packet


class Capture:
    """A capture running in the kernel: iterate over it for Packets. `with fcap.capture(...) as cap:` detaches
    everything when the block ends (also on an exception); so do close() and garbage collection."""

    def __init__(self, points, filter: str | None = None, count: int | None = None, snaplen: int = SNAPLEN,
                 linktype: str | int | None = None, where: Iterable[str] = (), track: bool = False,
                 buffer_kib: int | None = None, timeout: float | None = None,
                 track_max: int | None = None, cgroup: str | None = None, container: str | None = None,
                 direction: str | None = None, **features):
        from fcap.features import config, selectors
        from fcap.live.planner import capture_config
        from fcap.live.session import Session
        unknown = sorted(set(features) - config.keywords() - set(selectors.NAMES))
        if unknown:   # (pid, comm, ...: fcap.features.selectors; stack, context, nft, dump, ct: fcap.features)
            raise TypeError(f"capture() got an unexpected keyword argument {unknown[0]!r}")
        points = [points] if isinstance(points, str) else list(points)
        if not points or not all(isinstance(p, str) and p for p in points):
            raise UsageError(f"capture points: a name or a list of names, e.g. 'tp_btf/net_dev_queue', not {points!r}")
        if count is not None and (not isinstance(count, int) or count < 1):
            raise UsageError(f"count: a positive number of packets, not {count!r}")
        self.count, self.timeout = count, timeout
        self.session = None
        said = dict(features, where=_strings(where, "where"), direction=direction, cgroup=cgroup,
                    container=container)
        cfg = capture_config(points, said.get, linktype=str(linktype) if linktype is not None else None,
                             snaplen=snaplen, filter=filter or None, buffer_kib=buffer_kib or 0, immediate=True,
                             track=bool(track), **({"track_max": track_max} if track_max else {}))
        session = Session(cfg)
        self._sink = _Packets()
        try:
            session.resolve()
            why = config.refusal(cfg, session.points)
            if why:
                raise UsageError(why)
            session.open()
            from fcap.live.output import start
            start(session, self._sink)
        except BaseException:
            session.close()
            raise
        self.session = session
        self.linktype = session.linktype.number
        self.fallbacks = list(session.fallbacks.values())   # the command line's "note:" lines (fcap.kernel.variants)
        self.delivered = 0
        self._queue = self._sink.queue
        from fcap.live.order import Pending
        self._pending = Pending(session.window)

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to tell
            pass

    @property
    def closed(self) -> bool:
        return self.session is None

    def close(self) -> None:
        """Detach every program, free the maps and buffers; the packets already read stay valid."""
        session, self.session = self.session, None
        if session is not None:
            session.close()
            self._sink.close()
            self._stats = session.stats

    @property
    def stats(self):
        """(captured, seen, lost): packets delivered, packets the programs recorded, records the buffer lost."""
        if self.session is not None:
            st = self.session.read_counters()
        else:
            st = getattr(self, "_stats", None)
        return (self.delivered, st.seen if st else 0, st.lost if st else 0)

    def __iter__(self) -> Iterator[Packet]:
        return self

    def __next__(self) -> Packet:
        p = self.next(self.timeout)
        if p is None:
            raise StopIteration
        return p

    def next(self, timeout: float | None = None) -> Packet | None:
        """The next packet, waiting at most `timeout` seconds (None: until one comes); None when the capture is
        over (count reached, closed) or the time is up."""
        import time
        if self.count is not None and self.delivered >= self.count:
            self.close()
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._queue:
            if self.session is None:
                return None
            left = POLL_MS if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
            self._poll(min(left, POLL_MS))
            if not self._queue and deadline is not None and time.monotonic() >= deadline:
                return None
        self.delivered += 1
        p = self._queue.popleft()
        if self.count is not None and self.delivered >= self.count:
            self.close()
        return p

    def _poll(self, ms: int) -> None:
        self.session.wait(self._pending, ms)
        if self.session.nft is not None:   # (--nft's trace events: read at each poll, their buffer kept empty)
            self.session.nft.pump()
        left = self.count - self.delivered - len(self._queue) if self.count is not None else 0
        for r in self.session.ordered(self._pending, left=left):   # (in time order across polls: fcap.live.order)
            self._sink.write(r)
        if self._pending.reached:   # (-c within reach: the oldest, once every program has published)
            self.session.detach()
            for r in self.session.ordered(self._pending, final=True, left=left):
                self._sink.write(r)


class _Packets(PacketSink):
    """The API's output (fcap.live.output): each record a Packet, queued for the caller."""

    def __init__(self):
        self.queue: collections.deque = collections.deque()

    def write(self, rec) -> None:
        self.queue.append(self.packet(rec))


def _strings(items, what: str) -> list[str]:
    items = [items] if isinstance(items, str) else list(items or ())
    if not all(isinstance(i, str) for i in items):
        raise UsageError(f"{what}: strings, not {items!r}")
    return items


def capture(points, filter: str | None = None, count: int | None = None, snaplen: int = SNAPLEN,
            linktype: str | int | None = None, where: Iterable[str] = (), track: bool = False,
            dump: Iterable[str] = (), stack: bool = False, **kw) -> Capture:
    """Capture at `points` (a name or a list: "tp_btf/net_dev_queue", "fentry/ip_rcv", ...). `filter`: tcpdump's
    expression; `count`: stop after that many packets; `linktype`: "EN10MB", "LINUX_SLL2", "RAW", ... (default as
    the fcap command); `where`: --where tests ('skb->len > 1000'); `dump`: --dump paths ('skb->dev'), found in
    each Packet's `dumps` (`ct`: as --ct, the conntrack entry's dump, "ct"); `track`: as --track, the filter
    decides where a packet is first seen, then its skb is followed to every point under one packet id
    (`track_max`: the tracking map's entries); `stack`: each Packet's
    `stack` holds the kernel stack at the point (FUNC+0xOFF per frame, innermost first); `context`: as --context,
    each Packet's cgroup, cgroup_path, container, pod, netns_name; `cgroup`, `container`: as --cgroup and
    --container; `nft`: as --nft, a netfilter drop's nft_family, nft_table, nft_chain, nft_rule (or nft_policy);
    `nft_netns`: as --nft-netns, further network namespaces (names, paths, "all") whose rules --nft names (nft_netns);
    every one-value predicate the command line has (fcap.features.selectors: `pid`, `comm`, `mark`, `ifindex`,
    `ifname`, `netns`, as --pid and the rest) and `direction` ("in", "out", as -Q), tested in the kernel. The programs
    are attached when this returns. Errors are fcap.FcapError types."""
    return Capture(points, filter=filter, count=count, snaplen=snaplen, linktype=linktype, where=where, track=track,
                   dump=dump, stack=stack, **kw)


# ---- files -----------------------------------------------------------------------------------------------------

def read(path) -> Iterator[Packet]:
    """The packets of a pcap/pcapng file (fcap's own metadata and dumps where the file carries them)."""
    from fcap.files.pcapread import read as read_records
    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(f"read: a file name, not {path!r}")
    try:
        done, finished = 0, False
        batched = _pcap_batches(path)
        if batched is not None:   # (a big pcap file: its Packets a batch at a time)
            from fcap.live.output import batch_packets
            try:
                for batch in batched:
                    yield from batch_packets(batch)
                    done += len(batch)
                finished = True
            except PcapFormatError:   # (the damage: the reader says what it is, after the packets before it)
                pass
        for n, rec in enumerate(read_records(path) if not finished else (), 1):
            if n > done:
                yield file_packet(rec)
    except OSError as e:
        raise FcapError(f"{path}: {e.strerror or e}") from None


_BATCHED_FROM = 2 << 20   # bytes of a pcap file from which fcap.read() reads it a batch at a time (numpy's import)


def _pcap_batches(path):
    """A big pcap file's batches (fcap.files.batches), or None (pcapng: its packets carry more than the batches
    read; a small file; no numpy)."""
    try:
        if os.path.getsize(path) < _BATCHED_FROM:
            return None
        from fcap.files import batches
        with open(path, "rb") as f:
            if not isinstance(batches._format(f.read(24)), tuple):
                return None
    except (OSError, ImportError):
        return None
    return batches.batches(path, FILE_BATCH, decoded=False)


def batches(path, size: int = FILE_BATCH):
    """The packets of a pcap/pcapng file as numpy arrays, `size` at a time, for analysis at C speed: each a Batch
    whose `fields` has a row per packet (ts_ns, caplen, len, linktype, iface, at; the decoded ethertype, proto,
    tcp_flags, sport, dport, src, dst: fcap.files.batches.FIELDS) and whose `data` holds the packets' bytes.

        for b in fcap.batches("out.pcap"):
            f = b.fields
            syns = f[(f["proto"] == 6) & (f["tcp_flags"] & 0x12 == 0x02)]
            print(len(syns), numpy.unique(syns["dport"], return_counts=True))
    """
    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(f"batches: a file name, not {path!r}")
    if size < 1:
        raise UsageError(f"batches: size {size} must be at least 1")
    from fcap.files.batches import batches as file_batches
    try:
        yield from file_batches(path, size)
    except OSError as e:
        raise FcapError(f"{path}: {e.strerror or e}") from None


def parse_comment(text: str) -> dict:
    """fcap's metadata comment (fcap.features.comments: the packet's metadata, --context's keys, at drop points
    ' reason=R at=L', with --nft a netfilter drop's nft_* keys, a BPF program's verdict, then with --stack
    ' stack=F<F...') back as {attribute: value} (reason and location as text, the stack as frames); {} when it is not
    one."""
    return comments.parse(text)


