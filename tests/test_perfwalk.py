"""The perf buffer's pcap drain at C speed (fcap.live.perfwalk) against the per-record Python walk it replaces: the
same bytes written, the same records held and counted, over rings of records of many sizes and runs of one size,
LOST records, records that wrap the ring's end, and CPUs whose records interleave in time. (The drain on a real
kernel's perf buffer: tests/test_order.py and tests/test_capture.py with --perf-buffer.)"""

from __future__ import annotations

import io
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcap.live import drain as fdrain
from tests.test_order import _FakePerf, _Sink

if fdrain.FAST.wait() is None:
    pytest.skip(f"numpy: {fdrain.FAST.missing}", allow_module_level=True)

from fcap.live import perfwalk  # noqa: E402 (after numpy's check)

RING = 16384


def _pcapng():
    """A pcapng writer into memory, and the drain's options: a comment from metadata in the cache key, flags."""
    from fcap.files.pcapfile import PcapngWriter
    out = io.BytesIO()
    w = PcapngWriter(out, closefd=False)
    w.add_interface("x", 1)
    w.out = out
    return w, lambda rec: {"comment": f"skb={rec.skb:#x} len={rec.len}" * (rec.skb % 3), "flags": rec.skb & 1}


LEAD = 16   # --dump's area before META (fcap.live.drain.FileDrain's lead): here its first byte, the payload's % 3


def _lead_parse(raw):
    """The session's parse where samples start with LEAD bytes: here (those bytes, the Record after them)."""
    from fcap.kernel.layout import parse_record
    return bytes(raw[:LEAD]), parse_record(memoryview(raw)[LEAD:])


def _lead_options(rec) -> dict:
    area, r = rec
    return {"comment": f"area={area[0]} skb={r.skb:#x}", "flags": r.skb & 1}


def _run(script: list, fast: bool, monkeypatch, limit: int = 0, fmt: str = "pcap",
         lead: bool = False) -> tuple[bytes, list, int, int]:
    """Plays `script` into two CPUs' rings, a drain pass after each step; the bytes written, each pass's count, the
    LOST count and how many passes the arrays took. `lead`: each sample starts with LEAD bytes (pcapng)."""
    calls = {"arrays": 0}
    real = fdrain.FileDrain._arrays

    def spy(self, *a):
        n = real(self, *a)
        calls["arrays"] += n is not None
        return n
    monkeypatch.setattr(fdrain.FileDrain, "_arrays", spy)
    buf = _FakePerf(2)
    for r in buf.rings:
        r.__init__(RING)
    if fmt in ("pcap", fdrain.WITH_META):
        sink = _Sink() if fmt == "pcap" else _MetaSink()
        d = fdrain.FileDrain(buf, sink, limit=limit, fast=fast)
    elif lead:
        sink, _options = _pcapng()
        d = fdrain.FileDrain(buf, sink, options=_lead_options, limit=limit, fast=fast, parse=_lead_parse, lead=LEAD)
    else:
        sink, options = _pcapng()
        d = fdrain.FileDrain(buf, sink, options=options, limit=limit, fast=fast)
    t0 = time.monotonic_ns() - 5 * 10**9   # (the window's margin, grown by late records, stays under a second)
    counts = []
    for step in script:
        for cpu, dt, size, lost in step:
            ring = buf.rings[cpu]
            if ring.head - ring.tail + 24 + 160 + LEAD + size > RING:
                continue
            if lost:
                ring.lost(lost)
            else:
                area = bytes([(dt & 0xFF) % 3]) * LEAD if lead else b""
                ring.sample(t0 + 2 * dt + cpu, bytes([dt & 0xFF]) * size, skb=0xFFFF0000 + dt % 5, id=dt * 0x10001,
                            len=size, lead=area)   # (no two CPUs at one time: their order would be either)
        counts.append(d())
    counts.append(d(final=True))
    return bytes(sink.out if fmt != "pcapng" else sink.out.getvalue()), counts, buf.lost, calls["arrays"]


class _MetaSink(_Sink):
    """A writer of records with their META (fcap.live.drain.WITH_META): the arrays hand over where each starts."""
    fmt = fdrain.WITH_META

    def write_records(self, data, starts):
        from fcap.kernel.layout import META, META_SIZE
        data = bytes(data)
        chain, at = [], 0
        while at < len(data):
            chain.append(at)
            at += META_SIZE + META.unpack(data, at).caplen
        assert list(starts) == chain
        self.out += data


times = st.integers(0, 10**6) | st.just(5 * 10**9)   # (the latter: past the cutoff, held until the last pass)
records = st.tuples(st.integers(0, 1), times, st.integers(1, 90), st.integers(0, 1) | st.just(0))
runs = st.builds(lambda cpu, dt, size, n: [(cpu, dt + i, size, 0) for i in range(n)],
                 st.integers(0, 1), st.integers(0, 10**6), st.integers(1, 40), st.integers(16, 60))
steps = st.lists(st.one_of(st.lists(records, max_size=40), runs), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(script=steps, limit=st.sampled_from([0, 0, 5, 17]), fmt=st.sampled_from(["pcap", "pcapng"]))
def test_arrays_write_what_the_python_walk_writes(script, limit, fmt):
    with pytest.MonkeyPatch.context() as mp:
        fast = _run(script, True, mp, limit, fmt)
    with pytest.MonkeyPatch.context() as mp:
        slow = _run(script, False, mp, limit, fmt)
    assert fast[:3] == slow[:3]
    assert fast[3] == len(script) + 1 and slow[3] == 0


@settings(max_examples=60, deadline=None)
@given(script=steps, limit=st.sampled_from([0, 5]))
def test_records_with_their_meta_are_the_pcap_records_after_it(script, limit):
    """A writer that takes the records with their metadata (WITH_META, --json's) gets, record after record, each
    one's META and then the pcap record the drain writes to a file (its header the end of META): the same records,
    in the same order, counted alike, by the arrays and by the Python walk."""
    from fcap.kernel.layout import META, META_SIZE, PCAP_REC, parse_record
    with pytest.MonkeyPatch.context() as mp:
        pcap = _run(script, True, mp, limit, "pcap")
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            meta = _run(script, fast, mp, limit, fdrain.WITH_META)
        assert meta[1:3] == pcap[1:3]
        data, at, tails = meta[0], 0, []
        while at < len(data):
            m = META.unpack(data, at)
            assert m.fast == m.caplen and parse_record(data[at:at + META_SIZE + m.caplen]).ts_ns == m.ts
            tails.append(data[at + PCAP_REC:at + META_SIZE + m.caplen])
            at += META_SIZE + m.caplen
        assert b"".join(tails) == pcap[0] and len(tails) == sum(meta[1])


@settings(max_examples=100, deadline=None)
@given(script=steps, limit=st.sampled_from([0, 0, 5, 17]))
def test_a_lead_before_meta_is_in_each_blocks_options(script, limit):
    """Samples with bytes before META (--dump's area, which the options depend on): the arrays and the Python walk
    write the same blocks, and each block's comment tells its own sample's area (the cache is keyed by it too)."""
    with pytest.MonkeyPatch.context() as mp:
        fast = _run(script, True, mp, limit, "pcapng", lead=True)
    with pytest.MonkeyPatch.context() as mp:
        slow = _run(script, False, mp, limit, "pcapng", lead=True)
    assert fast[:3] == slow[:3]
    assert fast[3] == len(script) + 1 and slow[3] == 0
    from fcap.files import pcapread
    for r in pcapread.read(io.BytesIO(fast[0])):
        assert f"area={r.data[0] % 3} " in r.comment


@settings(max_examples=60, deadline=None)
@given(script=steps, limit=st.sampled_from([0, 5]))
def test_a_full_block_cache_is_emptied_between_passes_not_within_one(script, limit):
    """pcapng with a cache bound of 2 entries and records of 10 keys on both CPUs: a pass plans every CPU's
    blocks before it lays any out, so the cache is emptied only between passes; the arrays write what the Python
    walk writes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(perfwalk, "BLOCK_CACHE_MAX", 2)
        fast = _run(script, True, mp, limit, "pcapng")
    with pytest.MonkeyPatch.context() as mp:
        slow = _run(script, False, mp, limit, "pcapng")
    assert fast[:3] == slow[:3]


def test_a_uniform_run_is_one_array(monkeypatch):
    """A flood of one packet size: the run is found with one array operation, not a record at a time."""
    loops = []
    real = perfwalk._loop
    monkeypatch.setattr(perfwalk, "_loop", lambda *a: loops.append(1) or real(*a))
    script = [[(0, i, 40, 0) for i in range(20)]]
    out, counts, _lost, arrays = _run(script, True, monkeypatch)
    assert counts[0] == 20 and arrays == 2 and not loops and len(out) == 20 * (16 + 40)


def test_a_record_python_lays_out_leaves_the_pass_to_python(monkeypatch):
    """A sample whose bytes are not contiguous (`fast` 0: user space assembles them) sends the whole pass to the
    Python walk, which lays it out."""
    buf, sink = _FakePerf(2), _Sink()
    d = fdrain.FileDrain(buf, sink)
    t = time.monotonic_ns() - 10**9
    buf.rings[0].sample(t, b"ok|")
    assert perfwalk.read(buf.rings[0], buf.rings[0].address()).simple
    buf.rings[1].sample(t + 1, b"whole|")
    data = buf.rings[1].data
    at = 12 + fdrain.META.off("fast")
    data[at:at + 4] = bytes(4)   # fast = 0
    assert not perfwalk.read(buf.rings[1], buf.rings[1].address()).simple
    assert d._arrays(fdrain.FAST.module, fdrain.order.FINAL, True) is None and sink.out == b""
    assert d(final=True) == 2 and sink.out.endswith(b"whole|")


def test_keys_sharing_a_hash_leave_the_pass_to_python(monkeypatch):
    """pcapng: two records whose cache keys differ but hash alike are never given each other's options."""
    script = [[(0, i, 30, 0) for i in range(8)]]
    want = _run(script, False, monkeypatch, fmt="pcapng")
    monkeypatch.setattr(perfwalk, "_hash", lambda keys: keys[:, 0] * perfwalk.U64(0))   # every key hashes to 0
    got = _run(script, True, monkeypatch, fmt="pcapng")
    assert got[:3] == want[:3] and got[3] == 1   # (the last pass, empty)
