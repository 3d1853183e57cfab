"""--nft: which nftables table, chain and rule dropped a packet netfilter dropped (reason NETFILTER_DROP), from
nf_tables' own tracing, in user space: fcap adds a table of its own (`inet fcap_nftrace_PID`, base chains at
prerouting and output before every other, each `meta nftrace set 1`, so that every packet of this network namespace
carries the trace bit), listens to the kernel's trace events (NFNLGRP_NFTRACE: table, chain, rule handle, verdict
and the packet's headers for each chain a packet runs through) and gives each drop record the event that decided
its drop: the oldest drop verdict not yet given whose packet headers are the record's. The table is the trace
socket's (NFT_TABLE_F_OWNER, 5.12+: the kernel removes it when fcap's socket closes, even when fcap is killed) and
fcap deletes it when the capture ends. No BPF: it works where kprobes and fentry do not (this host)."""

from __future__ import annotations

import collections
import errno as errnos
import os
import time
from typing import NamedTuple

from fcap.errors import CaptureError
from fcap.host import nftables as nft

TABLE_PREFIX = "fcap_nftrace_"
HOOKS = (("pre", nft.Hook.prerouting), ("out", nft.Hook.output))   # a packet's first hook: received, or made here
RCVBUF = 32 << 20           # the trace socket's buffer (every chain a packet runs through sends an event)
EXPIRE_NS = 1_000_000_000   # a drop verdict read this long before a drop record was made is not that record's
HEADERS_MAX = 8192          # trace ids whose packet headers are kept (the events after the first carry none)
VERDICTS_MAX = 65536        # drop verdicts waiting for their record
NETFILTER_DROP = "NETFILTER_DROP"


class Decision(NamedTuple):
    """A drop verdict of nf_tables, waiting for its drop record."""

    family: str
    table: str
    chain: str
    rule: int | None          # the rule's handle; None: the chain's policy
    network: bytes            # the packet's network header as the trace event gave it
    transport: bytes          # the first bytes of its transport header (b"": none)
    mark: int
    read_ns: int              # CLOCK_MONOTONIC when fcap read the event
    netns: int = 0            # the table's network namespace (inode number) when not fcap's own, else 0

    def values(self) -> dict:
        """{Packet attribute: value}: nft_family, nft_table, nft_chain, nft_rule, nft_policy, nft_netns."""
        return {"nft_family": self.family, "nft_table": word(self.table), "nft_chain": word(self.chain),
                "nft_rule": self.rule, "nft_policy": "drop" if self.rule is None else None,
                "nft_netns": self.netns or None}

    def matches(self, l3: bytes, mark: int) -> bool:
        """Whether a drop record's bytes from its network header (`l3`, as far as captured) and skb mark are this
        packet's."""
        if self.mark and mark != self.mark:
            return False
        n = min(len(l3), len(self.network))
        if n == 0 or l3[:n] != self.network[:n]:
            return False
        if not self.transport or len(l3) <= len(self.network):
            return True
        at = _transport_offset(l3, len(self.network))
        have = l3[at:at + len(self.transport)]
        return have == self.transport[:len(have)]


def word(name: str) -> str:
    """A table's or chain's name as one word of the comment (nft allows quoted names with spaces): white space and
    backslashes as \\xHH."""
    return "".join(f"\\x{ord(c):02x}" if c.isspace() or c == "\\" else c for c in name)


def _transport_offset(l3: bytes, network_len: int) -> int:
    """Where the transport header starts in l3: IPv4's header length; IPv6's 40 when the next header is one
    (no extension headers), else past the part of them the trace gave (the network header, cut at 40 bytes)."""
    if l3[0] >> 4 == 4:
        return (l3[0] & 0xF) * 4
    if l3[0] >> 4 == 6 and len(l3) > 6 and l3[6] in (6, 17, 58, 132):
        return 40
    return network_len


def is_netfilter_drop(reason: str | None, location: str | None) -> bool:
    """A drop netfilter decided: reason NETFILTER_DROP; where the kernel has no reasons (before 5.17), freed in
    nf_hook_slow."""
    if reason is not None:
        return reason == NETFILTER_DROP
    return bool(location) and location.split("+", 1)[0] == "nf_hook_slow"


class Waiting:
    """The drop verdicts waiting for their records, oldest first (at most `most`), found by their packet's network
    header: a record is looked up once per length of header waiting, not matched against every verdict (a drop
    flood whose trace events were lost leaves up to `most` verdicts no record takes)."""

    def __init__(self, most: int = VERDICTS_MAX):
        self.most = most
        self.order: collections.deque = collections.deque()   # (number, Decision), oldest first; taken ones too
        self.live: dict[int, Decision] = {}                     # number -> those not taken nor expired
        self.by_header: dict[int, dict[bytes, collections.deque]] = {}   # header length -> header -> numbers
        self.added = 0

    def __len__(self) -> int:
        return len(self.live)

    def add(self, d: Decision) -> None:
        self.added += 1
        self.order.append((self.added, d))
        self.live[self.added] = d
        self.by_header.setdefault(len(d.network), {}).setdefault(d.network, collections.deque()).append(self.added)
        while len(self.live) > self.most or self.order and self.order[0][0] not in self.live:
            self._forget_oldest()

    def expire(self, before_ns: int) -> None:
        """Forget those read before `before_ns` (CLOCK_MONOTONIC)."""
        while self.order and (self.order[0][0] not in self.live or self.order[0][1].read_ns < before_ns):
            self._forget_oldest()

    def take(self, l3: bytes, mark: int) -> Decision | None:
        """The oldest waiting verdict whose packet a record's bytes from the network header and mark are, taken."""
        best, l3 = None, bytes(l3)
        for length, headers in self.by_header.items():
            if len(l3) >= length:
                numbers = headers.get(l3[:length], ())
            else:   # (the record's bytes end inside the header: every header they begin)
                numbers = sorted(n for head, ns in headers.items() if head.startswith(l3) for n in ns)
            found = self._oldest(numbers, l3, mark)
            if found is not None and (best is None or found < best):
                best = found
        if best is None:
            return None
        d = self.live.pop(best)
        numbers = self.by_header[len(d.network)][d.network]
        numbers.remove(best)
        if not numbers:
            self._drop_header(d.network)
        return d

    def _oldest(self, numbers, l3: bytes, mark: int) -> int | None:
        for n in numbers:
            d = self.live.get(n)
            if d is not None and d.matches(l3, mark):
                return n
        return None

    def _forget_oldest(self) -> None:
        n, d = self.order.popleft()
        if self.live.pop(n, None) is None:
            return   # (taken: gone from its header's numbers then)
        numbers = self.by_header[len(d.network)][d.network]
        numbers.remove(n)
        if not numbers:
            self._drop_header(d.network)

    def _drop_header(self, network: bytes) -> None:
        headers = self.by_header[len(network)]
        del headers[network]
        if not headers:
            del self.by_header[len(network)]


class Tracer:
    """The trace table (made when this is made) and the trace events, matched to drop records: take().
    close() deletes the table; the kernel deletes it too when the socket goes (kernels with owner tables)."""

    def __init__(self, table: str | None = None, netns: int = 0, elsewhere: bool = False):
        self.table = table or f"{TABLE_PREFIX}{os.getpid()}"
        self.netns = netns        # the namespace's inode number, where the sockets are made (0: not known)
        self.elsewhere = elsewhere   # not fcap's own namespace: its decisions say which (nft_netns)
        self.listener = nft.NfSocket(trace=True, rcvbuf=RCVBUF)   # first: no event of the table's is missed
        try:   # only the events a drop needs are queued (fcap.host.nftfilter); without it, all of them
            from fcap.host import nftfilter
            nftfilter.attach(self.listener.sock)
            self.filtered = True
        except OSError:
            self.filtered = False
        self.control = nft.NfSocket()
        self.owned = True
        err = self.control.transact(nft.Family.inet, *self._parts(owner=True))
        if err in (errnos.EOPNOTSUPP, errnos.EINVAL):   # before 5.12: no owner flag
            self.owned = False
            err = self.control.transact(nft.Family.inet, *self._parts(owner=False))
        if err:
            self.listener.close()
            self.control.close()
            why = "a table of that name exists" if err == errnos.EEXIST else os.strerror(err)
            raise CaptureError(f"--nft: cannot add the trace table inet {self.table} ({why})")
        self.added = True
        self.headers: collections.OrderedDict = collections.OrderedDict()   # trace id -> (network, transport)
        self.waiting = Waiting()
        self.lost = 0             # reads of trace events that failed for want of buffer

    def _parts(self, owner: bool) -> list:
        parts = [nft.new_table(self.table, owner)]
        for chain, hook in HOOKS:
            parts += [nft.new_base_chain(self.table, chain, hook, nft.PRIORITY_FIRST),
                      nft.new_trace_rule(self.table, chain)]
        return parts

    def pump(self) -> None:
        """Read the events waiting: each packet's headers by trace id, the drop verdicts (not the trace table's)."""
        events, lost = self.listener.traces()
        self.lost += lost
        now = time.monotonic_ns()
        for t in events:
            if t.network is not None:
                self.headers[t.id] = (t.network, t.transport or b"")
                self.headers.move_to_end(t.id)
                if len(self.headers) > HEADERS_MAX:
                    self.headers.popitem(last=False)
            if not t.decides_drop() or (t.family == "inet" and t.table == self.table):
                continue
            head = self.headers.get(t.id)
            if head is None:
                continue
            self.waiting.add(Decision(t.family, t.table, t.chain, t.rule if t.type == nft.TraceType.RULE
                                      else None, head[0], head[1], t.mark, now, self.netns if self.elsewhere else 0))

    def take(self, l3: bytes, mark: int, ts_ns: int) -> Decision | None:
        """The drop verdict of a netfilter drop record (its bytes from the network header, skb mark and
        CLOCK_MONOTONIC time): the oldest waiting one of the same packet, taken; None when none is."""
        self.pump()
        self.waiting.expire(ts_ns - EXPIRE_NS)
        return self.waiting.take(l3, mark)

    def close(self) -> None:
        """Delete the trace table (once) and close the sockets."""
        if self.added:
            self.added = False
            self.control.transact(nft.Family.inet, nft.del_table(self.table))
            self.control.close()
            self.listener.close()


class Tracers:
    """--nft in several network namespaces (`where`: fcap.host.namespaces names, besides fcap's own): a Tracer made
    inside each (its table there, its sockets bound there), as one: a drop record's verdict is looked for first in
    the namespace its device is in, then in the others. close() deletes every table."""

    def __init__(self, where: list | tuple = ()):
        from fcap.host import namespaces
        own = namespaces.own()
        self.tracers = [Tracer(netns=own.inum)]
        try:
            found: dict = {}   # inode number -> (the namespace by the first name given for it, asked by name)
            for w in where:
                for n in namespaces.find(w):
                    found.setdefault(n.inum, (n, w != namespaces.EVERY))
            found.pop(own.inum, None)
            for ns, named in found.values():
                try:
                    with namespaces.inside(ns):
                        self.tracers.append(Tracer(netns=ns.inum, elsewhere=True))
                except OSError as e:
                    if named or e.errno not in (errnos.ENOENT, errnos.ESRCH):
                        raise CaptureError(f"--nft-netns {ns.label}: cannot enter {ns.path} ({e.strerror})") from None
                    # (all: a process's namespace gone since it was found)
        except BaseException:
            self.close()
            raise
        self.attributed = self.unattributed = 0

    @property
    def lost(self) -> int:
        return sum(t.lost for t in self.tracers)

    def pump(self) -> None:
        for t in self.tracers:
            t.pump()

    def attribute(self, l3: bytes, mark: int, ts_ns: int, netns: int = 0) -> Decision | None:
        """As Tracer.attribute, in the namespace `netns` (the record's device's) first."""
        for t in sorted(self.tracers, key=lambda t: t.netns != netns):
            d = t.take(l3, mark, ts_ns)
            if d is not None:
                self.attributed += 1
                return d
        self.unattributed += 1
        return None

    def note(self) -> str:
        """One line when netfilter drops went unattributed, else ""."""
        if not self.unattributed:
            return ""
        where = "these network namespaces" if len(self.tracers) > 1 else "this network namespace"
        why = (f"{self.lost} reads of trace events failed for want of buffer (ENOBUFS)" if self.lost else
               f"no nftables drop verdict of {where} matched (iptables-legacy, a netdev, bridge or arp table, or "
               f"another namespace: --nft-netns)")
        return f"--nft: {self.unattributed} netfilter drops not attributed: {why}"

    def close(self) -> None:
        for t in self.tracers:
            t.close()
