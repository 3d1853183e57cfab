"""--nft: which nftables table, chain and rule dropped a packet netfilter dropped (reason NETFILTER_DROP), from
nf_tables' own tracing: fcap adds a table of its own (`inet fcap_nftrace_PID`, base chains at prerouting and output
before every other, each `meta nftrace set 1`, so that every packet of this network namespace carries the trace bit)
and listens to the kernel's trace events (NFNLGRP_NFTRACE) with a program on the socket that finds each drop verdict
in the kernel, as it is sent (fcap.kernel.nftfilter, which the caller puts on: `attach`); the socket queues only
what that program lets through (the first drop verdict of each rule), read here as it came. The table is the trace
socket's
(NFT_TABLE_F_OWNER, 5.12+: the kernel removes it when fcap's socket closes, even when fcap is killed) and fcap
deletes it when the capture ends. No kprobe, no fentry: it works where they do not (this host)."""

from __future__ import annotations

import errno as errnos
import os
from typing import NamedTuple

from fcap.errors import CaptureError
from fcap.host import nftables as nft

TABLE_PREFIX = "fcap_nftrace_"
HOOKS = (("pre", nft.Hook.prerouting), ("out", nft.Hook.output))   # a packet's first hook: received, or made here
RCVBUF = 4 << 20            # the trace socket's buffer (the first drop verdicts of each rule, until it is named)
NETFILTER_DROP = "NETFILTER_DROP"


class Decision(NamedTuple):
    """The nftables rule (or base chain's policy) a rule key names."""

    family: str
    table: str
    chain: str
    rule: int | None          # the rule's handle; None: the chain's policy
    netns: int = 0            # the table's network namespace (inode number) when not fcap's own, else 0

    def values(self) -> dict:
        """{Packet attribute: value}: nft_family, nft_table, nft_chain, nft_rule, nft_policy, nft_netns."""
        return {"nft_family": self.family, "nft_table": word(self.table), "nft_chain": word(self.chain),
                "nft_rule": self.rule, "nft_policy": "drop" if self.rule is None else None,
                "nft_netns": self.netns or None}


def word(name: str) -> str:
    """A table's or chain's name as one word of the comment (nft allows quoted names with spaces): white space and
    backslashes as \\xHH."""
    return "".join(f"\\x{ord(c):02x}" if c.isspace() or c == "\\" else c for c in name)


def is_netfilter_drop(reason: str | None, location: str | None) -> bool:
    """A drop netfilter decided: reason NETFILTER_DROP; where the kernel has no reasons (before 5.17), freed in
    nf_hook_slow."""
    if reason is not None:
        return reason == NETFILTER_DROP
    return bool(location) and location.split("+", 1)[0] == "nf_hook_slow"


class Tracer:
    """The trace table (made when this is made) and the trace socket, with the program `attach(socket, netns)`
    puts on it (closed after the socket): payloads() reads what it queued. close() deletes the table; the kernel
    deletes it too when the socket goes (kernels with owner tables)."""

    def __init__(self, attach, netns: int = 0, elsewhere: bool = False, table: str | None = None):
        self.table = table or f"{TABLE_PREFIX}{os.getpid()}"
        self.netns = netns        # the namespace's inode number, where the sockets are made (0: not known)
        self.elsewhere = elsewhere   # not fcap's own namespace: its decisions say which (nft_netns)
        # the table first: its batch loads nf_tables where that is a module, and waits for it, where subscribing the
        # trace socket only starts loading it (a batch sent meanwhile is refused: EOPNOTSUPP). The events of the
        # packets traced before the socket is there are no drop record's: no program is attached yet.
        self.control = nft.NfSocket()
        self.owned = True
        err = self.control.transact(nft.Family.inet, *self._parts(owner=True))
        if err in (errnos.EOPNOTSUPP, errnos.EINVAL):   # before 5.12: no owner flag
            self.owned = False
            err = self.control.transact(nft.Family.inet, *self._parts(owner=False))
        if err:
            self.control.close()
            why = "a table of that name exists" if err == errnos.EEXIST else os.strerror(err)
            raise CaptureError(f"--nft: cannot add the trace table inet {self.table} ({why})")
        self.added = True
        self.listener = self.program = None
        try:
            self.listener = nft.NfSocket(trace=True, rcvbuf=RCVBUF)
            self.program = attach(self.listener.sock, netns)
        except BaseException:
            self.close()
            raise
        self.lost = 0             # reads of trace events that failed for want of buffer

    def _parts(self, owner: bool) -> list:
        parts = [nft.new_table(self.table, owner)]
        for chain, hook in HOOKS:
            parts += [nft.new_base_chain(self.table, chain, hook, nft.PRIORITY_FIRST),
                      nft.new_trace_rule(self.table, chain)]
        return parts

    def payloads(self) -> list[bytes]:
        """The trace events queued since (each message's payload after nlmsghdr)."""
        payloads, lost = self.listener.trace_payloads()
        self.lost += lost
        return payloads

    def decision(self, t: nft.Trace) -> Decision:
        """What a drop verdict's event names, as this namespace's."""
        return Decision(t.family, t.table, t.chain, t.rule if t.type == nft.TraceType.RULE else None,
                        self.netns if self.elsewhere else 0)

    def _close_sockets(self) -> None:
        for c in (self.control, self.listener, self.program):
            if c is not None:
                c.close()

    def close(self) -> None:
        """Delete the trace table (once) and close the sockets."""
        if self.added:
            self.added = False
            self.control.transact(nft.Family.inet, nft.del_table(self.table))
            self._close_sockets()


class Tracers:
    """--nft in several network namespaces (`where`: fcap.host.namespaces names, besides fcap's own): a Tracer made
    inside each (its table there, its socket bound there, `attach` its program), as one. close() deletes every
    table."""

    def __init__(self, attach, where: list | tuple = ()):
        from fcap.host import namespaces
        own = namespaces.own()
        self.tracers = [Tracer(attach, netns=own.inum)]
        try:
            found: dict = {}   # inode number -> (the namespace by the first name given for it, asked by name)
            for w in where:
                for n in namespaces.find(w):
                    found.setdefault(n.inum, (n, w != namespaces.EVERY))
            found.pop(own.inum, None)
            for ns, named in found.values():
                try:
                    with namespaces.inside(ns):
                        self.tracers.append(Tracer(attach, netns=ns.inum, elsewhere=True))
                except OSError as e:
                    if named or e.errno not in (errnos.ENOENT, errnos.ESRCH):
                        raise CaptureError(f"--nft-netns {ns.label}: cannot enter {ns.path} ({e.strerror})") from None
                    # (all: a process's namespace gone since it was found)
        except BaseException:
            self.close()
            raise

    @property
    def lost(self) -> int:
        return sum(t.lost for t in self.tracers)

    def note(self, unattributed: int) -> str:
        """One line when netfilter drops went unattributed, else ""."""
        if not unattributed:
            return ""
        where = "these network namespaces" if len(self.tracers) > 1 else "this network namespace"
        why = (f"{self.lost} reads of trace events failed for want of buffer (ENOBUFS)" if self.lost else
               f"no nftables drop verdict of {where} matched (iptables-legacy, a netdev, bridge or arp table, or "
               f"another namespace: --nft-netns)")
        return f"--nft: {unattributed} netfilter drops not attributed: {why}"

    def close(self) -> None:
        for t in self.tracers:
            t.close()
