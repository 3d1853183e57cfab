"""Untyped programs (raw_tp, kprobe, multi-attach) read the skb's members from one copy of them (fcap.kernel.snapshot):
their records equal a typed program's at the same tracepoint, field for field, and a filter over Linux's ancillary
fields keeps the same packets; typed programs make no copy."""

from __future__ import annotations

import os
import socket

import pytest

from bpf.asm import DW, R2, R3, R6, R7, R8, B
from bpf.uapi import Helper
from fcap.kernel import program as cprog
from fcap.kernel.layout import FLAG_LINEAR_ONLY, RECORD_PCAPNG, SKB_SNAP, SKB_SNAP_MAX, START_MAC, START_SLL2
from fcap.kernel.snapshot import Snapshot
from fcap.points.spec import resolve
from tests import netns

TRACEPOINTS = ("net_dev_queue", "netif_receive_skb")
SO_MARK = 36
MARK = 0x2A
AD = 0xFFFFF000


def _builder(spec: str, **opts):
    point = resolve(spec)
    point.id = 3
    o = cprog.ProgramOptions(start=opts.pop("start", START_MAC), snaplen=262144, **opts)
    maps = cprog.Maps(events=-1, scratch=-2, counters=-3, scratch_size=cprog.scratch_size(point, o))
    b = cprog.Builder(point, o, maps)
    return b, [i for i in b.build() if hasattr(i, "op")]


def _calls(insns, helper) -> list[int]:
    return [k for k, i in enumerate(insns) if i.op == 0x85 and i.imm == helper]


def _reads_from_skb(insns) -> list[int]:
    """The bpf_probe_read_kernel calls whose source is the skb (R3 = R6 + offset)."""
    return [k for k in _calls(insns, Helper.probe_read_kernel)
            if any(i.op == 0xBF and i.dst == R3 and i.src == R6 for i in insns[k - 2:k])]


def _snapshot_loads(insns) -> list:
    return [i for i in insns if i.op & 0x07 == 0x01 and i.src == R7 and SKB_SNAP <= i.off < SKB_SNAP + SKB_SNAP_MAX]


OPTIONS = [dict(), dict(filter=[(0x06, 0, 0, 0)]), dict(start=START_SLL2, record=RECORD_PCAPNG, context=True),
           dict(filter=[(0x20, 0, 0, AD + 12), (0x06, 0, 0, 0)], ident="track", points=2)]


@pytest.mark.parametrize("opts", OPTIONS, ids=["plain", "filter", "sll2-pcapng-context", "ancillary-track"])
def test_typed_programs_make_no_copy(opts):
    """A BTF-typed program loads the skb's members directly: no copy, nothing read from the copy's area."""
    b, insns = _builder("tp_btf/net_dev_queue", **opts)
    assert b.snap is None
    assert not _snapshot_loads(insns) and not _reads_from_skb(insns)


@pytest.mark.parametrize("opts", OPTIONS, ids=["plain", "filter", "sll2-pcapng-context", "ancillary-track"])
def test_untyped_programs_read_the_skb_once(opts):
    """An untyped program copies the skb's members it reads with one bpf_probe_read_kernel from the skb (the only
    one whose source is the skb itself), at its start, of a range no wider than the struct and the reserve."""
    b, insns = _builder("raw_tp/net_dev_queue", **opts)
    from_skb = _reads_from_skb(insns)
    assert len(from_skb) == 1, f"{len(from_skb)} reads from the skb"
    first = from_skb[0]
    loads = [k for k, i in enumerate(insns) if i in _snapshot_loads(insns)]
    assert loads and first < loads[0], "a load from the copy before the copy"
    assert insns[first - 3].dst == R2 and insns[first - 3].imm == b.snap.hi - b.snap.lo
    assert 0 <= b.snap.lo < b.snap.hi <= SKB_SNAP_MAX
    assert all(SKB_SNAP + b.snap.lo <= i.off < SKB_SNAP + b.snap.hi for i in _snapshot_loads(insns))
    vm = b.point.btf if b.point.btf.base is None else b.point.btf.base
    assert b.snap.hi <= vm.find("sk_buff", "struct").size
    assert cprog.scratch_size(b.point, b.options) >= SKB_SNAP + SKB_SNAP_MAX


@pytest.mark.parametrize("preds, after", [((), True), (("pid",), True), (("mark",), False)])
def test_the_copy_after_what_turns_away_without_it(preds, after):
    """The copy is made after the predicates where none of them reads the skb (--pid turns a packet away at no
    copy's cost), else before them; with --track (its lookup reads the skb) before the lookup."""
    from fcap.kernel import predicates
    made = {"pid": lambda: predicates.pid(1), "mark": lambda: predicates.mark(1)}
    b, insns = _builder("raw_tp/net_dev_queue", predicates=[made[p]() for p in preds], filter=[(0x06, 0, 0, 0)])
    copy = _reads_from_skb(insns)[0]
    pid_call = _calls(insns, Helper.get_current_pid_tgid)
    if "pid" in preds:
        assert pid_call[0] < copy
    counters = _calls(insns, Helper.map_lookup_elem)[1]   # (the hits counter, at the entry)
    assert (copy > counters) == after
    b, insns = _builder("raw_tp/net_dev_queue", ident="track", points=2, predicates=[predicates.pid(1)],
                        filter=[(0x06, 0, 0, 0)])
    assert _reads_from_skb(insns)[0] < _calls(insns, Helper.map_lookup_elem)[2] < _calls(
        insns, Helper.get_current_pid_tgid)[0]


def test_the_copy_never_passes_its_reserve():
    """A member past what the scratch value reserves is read on its own (the copy stays within SKB_SNAP_MAX); a
    program that reads no member makes no copy."""
    s = Snapshot()
    assert s.covers(DW, SKB_SNAP_MAX - 8) and not s.covers(DW, SKB_SNAP_MAX - 4) and not s.covers(B, SKB_SNAP_MAX)
    assert s.take(R7, R6) == []
    b, _ = _builder("raw_tp/net_dev_queue")
    b.items = []
    b.read(DW, R8, R6, SKB_SNAP_MAX - 4)
    assert _reads_from_skb(b.items) and not _snapshot_loads(b.items)
    b.items = []
    b.read(DW, R8, R6, SKB_SNAP_MAX - 8)
    assert _snapshot_loads(b.items) and not _calls(b.items, Helper.probe_read_kernel)


# ---- live: the same packets, the same records -----------------------------------------------------------------

def _session(v, points, cbpf=None, **cfg):
    """A capture at `points` of what crosses v's local end (other traffic on the machine left out)."""
    from fcap.kernel import predicates
    from fcap.live.session import Config, Session
    cfg.setdefault("predicates", [lambda p: predicates.ifindex(v.a_index)])
    s = Session(Config(points=points, buffer_kib=1024, **cfg))
    s.resolve()
    if cbpf is not None:
        s.cbpf = cbpf
    s.open()
    try:
        s.attach()
    except BaseException:
        s.close()
        raise
    return s


def _traffic(v, peer) -> list[bytes]:
    """Datagrams to the peer's echo (marked on the way out) and their echoes back."""
    payloads = [netns.payload(11, n) for n in (20, 300, 900, 1400)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, SO_MARK, MARK)
        s.settimeout(5)
        for p in payloads:
            s.sendto(p, (v.peer, peer.udp_port))
            assert s.recv(65536) == p
    return payloads


def _records(s, payloads) -> dict:
    """{(tracepoint, kind): {(skb, data): the record's fields but its point, time and stack}}."""
    recs: list = []
    s.run(lambda r: recs.append(r) or True, stop=lambda: True)
    assert s.read_counters().lost == 0
    kinds = {p.id: (p.name, str(p.kind)) for p in s.points}
    out: dict = {}
    for r in recs:
        if any(pl in r.data for pl in payloads):
            # (FLAG_LINEAR_ONLY: an untyped program's filter reads the linear bytes only, typed or not its copy)
            out.setdefault(kinds[r.point], {})[(r.skb, r.data)] = r._replace(point=0, ts_ns=0, stack=None,
                                                                             flags=r.flags & ~FLAG_LINEAR_ONLY)
    return out


def _capture(v, peer, points, cbpf=None, **cfg) -> tuple[list[bytes], dict]:
    """(the payloads sent, _records of them) through a session at `points` (_session's arguments)."""
    s = _session(v, points, cbpf, **cfg)
    try:
        payloads = _traffic(v, peer)
        return payloads, _records(s, payloads)
    finally:
        s.close()


@pytest.fixture(scope="module")
def veth():
    if os.geteuid() != 0:
        pytest.skip("needs root (loads BPF programs, makes a namespace)")
    v = netns.make_veth_ns()
    peer = netns.Peer(v, 0, 11)
    try:
        yield v, peer
    finally:
        peer.close()
        netns.remove_veth_ns(v)


@pytest.mark.parametrize("cfg", [dict(linktype="EN10MB"), dict(linktype="LINUX_SLL2", context=True),
                                 dict(linktype="EN10MB", filter="udp", record=RECORD_PCAPNG)],
                         ids=["en10mb", "sll2-context", "filter-pcapng"])
def test_untyped_records_equal_typed_ones(veth, cfg):
    """raw_tp and tp_btf at the same tracepoints in one capture: every datagram and echo once at each, with the
    same skb, bytes, lengths, device, namespace, mark, protocol, packet type, queue, flags, task and cgroup."""
    v, peer = veth
    points = [f"{k}/{t}" for t in TRACEPOINTS for k in ("tp_btf", "raw_tp")]
    payloads, got = _capture(v, peer, points, **cfg)
    for t in TRACEPOINTS:
        typed, raw = got.get((t, "tp_btf"), {}), got.get((t, "raw_tp"), {})
        assert len(typed) >= len(payloads), f"{t}: {len(typed)} records at tp_btf"
        assert raw == typed
    sent = got[("net_dev_queue", "tp_btf")].values()
    assert any(r.mark == MARK for r in sent) and all(r.ifindex and r.netns for r in sent)


FIELDS = {"mark": (12, MARK), "protocol": (0, 0x0800), "ifindex": (8, None), "hatype": (28, 1), "pkttype": (4, 0),
          "queue": (16, 0), "rxhash": (32, 0), "vlan present": (48, 0), "vlan tag": (44, 0), "vlan tpid": (60, 0)}


@pytest.mark.parametrize("name", list(FIELDS))
def test_ancillary_fields_keep_the_same_packets(veth, name):
    """A filter on one of Linux's ancillary fields (`ld [SKF_AD_OFF + n]; jeq K`) keeps the same packets at raw_tp
    as at tp_btf (the untyped program reads the member from its copy of the skb)."""
    v, peer = veth
    field, k = FIELDS[name]
    if k is None:
        k = v.a_index
    points = [f"{kind}/{t}" for t in TRACEPOINTS for kind in ("tp_btf", "raw_tp")]
    payloads, got = _capture(v, peer, points, [(0x20, 0, 0, AD + field), (0x15, 0, 1, k), (0x06, 0, 0, 262144),
                                               (0x06, 0, 0, 0)], linktype="EN10MB")
    for t in TRACEPOINTS:
        assert set(got.get((t, "raw_tp"), {})) == set(got.get((t, "tp_btf"), {})), f"{name} at {t}"
    if name in ("mark", "ifindex", "protocol", "hatype"):
        assert got.get(("net_dev_queue", "raw_tp")), f"{name} == {k:#x} kept nothing sent"


WHERE = ("skb->mark == 42", "skb->pkt_type == 0", "skb->len > 200", "skb->protocol == 0x800", "skb->dev->ifindex > 0")


@pytest.mark.parametrize("text", WHERE)
def test_where_on_the_skb_keeps_the_same_packets(veth, text):
    """--where over the point's skb (its members from the copy; through a pointer, read on their own) keeps the
    same packets at raw_tp as at tp_btf."""
    from fcap.kernel import predicates
    v, peer = veth
    points = [f"{kind}/{t}" for t in TRACEPOINTS for kind in ("tp_btf", "raw_tp")]
    payloads, got = _capture(v, peer, points, linktype="EN10MB",
                             predicates=[lambda p: predicates.ifindex(v.a_index), lambda p: predicates.where(p, text)])
    for t in TRACEPOINTS:
        assert set(got.get((t, "raw_tp"), {})) == set(got.get((t, "tp_btf"), {})), f"{text} at {t}"
    assert any(got.values()), f"{text} kept nothing"


def test_copy_after_the_predicates_records_the_same(veth):
    """--pid (no skb read: the copy comes after it) with a filter: what this process sends is recorded at raw_tp
    as at tp_btf, field for field."""
    from fcap.kernel import predicates
    v, peer = veth
    points = [f"{kind}/net_dev_queue" for kind in ("tp_btf", "raw_tp")]
    payloads, got = _capture(v, peer, points, linktype="LINUX_SLL2", filter="udp",
                             predicates=[lambda p: predicates.pid(os.getpid())])
    typed, raw = got.get(("net_dev_queue", "tp_btf"), {}), got.get(("net_dev_queue", "raw_tp"), {})
    assert len(typed) == len(payloads) and raw == typed
