"""The capture program's per-packet features are declared (fcap.kernel.parts): each says when it is on, what it
writes into the record, the maps it uses, what it emits at which stage and what user space reads back; and the
builder assembles a program from them for every kind of configuration (built only: nothing is loaded)."""

from __future__ import annotations

import importlib
import os

import pytest

from fcap.kernel import builders, context, dumps, layout, parts, predicates
from fcap.kernel import program as cprog

pytestmark = pytest.mark.skipif(not os.path.exists("/sys/kernel/btf/vmlinux"), reason="this kernel has no BTF")

ACCEPT = [(0x06, 0, 0, 0x40000)]   # cBPF `ret #262144`: what the translator makes of a filter, whatever it says
KINDS = ("tp_btf/net_dev_queue", "raw_tp/net_dev_queue", "fentry/ip_rcv", "fexit/ip_rcv", "kprobe/ip_rcv")


ROOT_USER = os.geteuid() == 0   # (points on BPF programs: a program of the test's own is loaded for them)
_TARGETS: dict = {}


def _resolve(spec):
    from fcap.points import progpoints
    from fcap.points.spec import resolve
    if progpoints.is_program_spec(spec):   # KIND.entry/* or KIND.exit/*: at a program loaded here, kept loaded
        from bpf.uapi import ProgType
        from bpfprogs import TestProgram
        word = spec.partition(".")[0]
        if word not in _TARGETS:
            _TARGETS[word] = TestProgram(ProgType.XDP if word == "xdp" else ProgType.SCHED_CLS,
                                         f"fcap_f{word}{os.getpid() % 10000}", 1, 2)
        return progpoints.resolve(f"{spec.partition('/')[0]}/{_TARGETS[word].id}")[0]
    return resolve(spec)


def _reader(dotted: str):
    """The object a feature's `reads` names (module, then attributes)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"{dotted}: nothing to import")


def test_every_feature_declares_its_parts():
    names = [f.name for f in cprog.PARTS]
    assert len(names) == len(set(names)) and all(names)
    meta_fields = set(layout.META.Tuple._fields)
    for f in cprog.PARTS:
        assert callable(f.on), f.name
        assert f.stages or f.within, f"{f.name}: neither stages nor the feature that emits it"
        assert set(f.stages) <= set(parts.STAGES), f.name
        assert all(callable(emit) for emit in f.stages.values()), f.name
        if f.within:
            assert f.within in names and not f.stages, f.name
        assert set(f.fields) <= meta_fields, f"{f.name}: {set(f.fields) - meta_fields} not in META"
        assert all(isinstance(flag, int) for flag in f.flags), f.name
        assert all(hasattr(layout, name) for name in f.layouts), f.name
        for use in f.maps:
            assert use.attr in cprog.Maps.__slots__ and use.what, f.name
        if f.reads:
            assert _reader(f.reads) is not None, f.name


def test_a_stage_name_that_does_not_exist_is_refused():
    with pytest.raises(ValueError):
        parts.Part("x", on=parts.always, stages={"nowhere": lambda b: None})


def _maps(point, opts, ring: bool = False, track: bool = False) -> cprog.Maps:
    maps = cprog.Maps(events=-1, scratch=-2, counters=-3, scratch_size=cprog.scratch_size(point, opts))
    if track:
        maps.track, maps.track_counters = -5, -6
    if ring:
        maps.ring, maps.ring_size, maps.dynptr_kfunc = -4, 1 << 20, 1
    if opts.stack:
        maps.stack = -7
    return maps


def _configurations():
    """(name, point specs, ProgramOptions keywords, ring) for each point kind and feature the host can build."""
    preds = [predicates.direction("in"), lambda p: predicates.pid(1), lambda p: predicates.comm("ping"),
             lambda p: predicates.mark(7), lambda p: predicates.ifname("lo"), lambda p: predicates.netns(1),
             lambda p: predicates.where(p, "skb->len > 100")]
    for kind in KINDS:
        for record in (layout.RECORD_PCAP, layout.RECORD_PCAPNG):
            base = dict(start=cprog.START_SLL2, snaplen=262144, record=record)
            yield f"{kind} {record}", [kind], base, False
            yield f"{kind} {record} filter", [kind], dict(base, filter=ACCEPT, dynptr_kfunc=1), False
            yield f"{kind} {record} track", [kind], dict(base, ident="track"), False
            yield f"{kind} {record} predicates", [kind], dict(base, predicates=preds), False
            yield f"{kind} {record} file ring", [kind], dict(base, count_seen=True), True
        yield f"{kind} en10mb", [kind], dict(start=cprog.START_MAC, snaplen=100, filter=ACCEPT), False
        yield f"{kind} no meta", [kind], dict(start=cprog.START_NETWORK, snaplen=100, meta=False), False
        yield f"{kind} context", [kind], dict(start=cprog.START_SLL2, snaplen=100, context=True, record="pcapng",
                                              predicates=[lambda p: context.under(1, 0),
                                                          lambda p: context.under(77, 2)]), False
        yield f"{kind} dump", [kind], dict(start=cprog.START_SLL2, snaplen=100, dumps=["skb->dev", "skb->len"]), False
        yield f"{kind} stack", [kind], dict(start=cprog.START_SLL2, snaplen=100, record=layout.RECORD_PCAPNG,
                                            stack=True), False
    if ROOT_USER:
        program_preds = preds[:-1] + [lambda p: predicates.where(p, f"{p.params[0].name}->data != 0")]
        for ends in (["xdp.entry/*", "xdp.exit/*"], ["tc.entry/*", "tc.exit/*"]):
            for start in (cprog.START_SLL2, cprog.START_MAC, cprog.START_NETWORK):
                yield f"{ends[1]} {start}", ends, dict(start=start, snaplen=262144, record=layout.RECORD_PCAPNG,
                                                       filter=ACCEPT, predicates=program_preds, ident="map",
                                                       points=2), False
    yield "drop point", ["tp_btf/kfree_skb", "raw_tp/kfree_skb"], dict(start=cprog.START_SLL2, snaplen=100), False
    nft = dict(start=cprog.START_SLL2, snaplen=100, record=layout.RECORD_PCAPNG, nft=True)
    yield "drop point nft", ["tp_btf/kfree_skb", "raw_tp/kfree_skb"], nft, False
    yield "drop point nft file ring", ["tp_btf/kfree_skb"], nft, True
    yield "several points", list(KINDS), dict(start=cprog.START_SLL2, snaplen=100, ident="map", points=5,
                                              filter=ACCEPT, predicates=preds), False


CONFIGURATIONS = list(_configurations())


def _builders(specs, kw, ring):
    """A built Builder per point of a configuration."""
    for spec in specs:
        point = _resolve(spec)
        point.id = 0
        kw = dict(kw)
        nft = kw.pop("nft", False)
        paths = kw.get("dumps")
        opts = cprog.ProgramOptions(**dict(kw, predicates=[make(point) for make in kw.get("predicates", ())],
                                    dumps=dumps.make_area([point], paths).for_point(point) if paths else None))
        maps = _maps(point, opts, ring=ring and point.typed, track=opts.ident != "none")
        if nft:
            maps.nftslot, maps.nfttext = -12, -13
            if maps.ring:
                maps.frags = -8
        b = builders.BUILDERS[point.kind.context](point, opts, maps)
        b.build()
        yield b


@pytest.mark.parametrize("name,specs,kw,ring", CONFIGURATIONS, ids=[c[0] for c in CONFIGURATIONS])
def test_the_builder_assembles_a_program_from_the_features(name, specs, kw, ring):
    for b in _builders(specs, kw, ring):
        point, opts = b.point, b.options
        assert b.items, name
        on = {f.name for f in b.parts}
        writers = [f for f in b.parts if parts.WRITE in f.stages]
        assert len(writers) == 1, f"{name}: {[f.name for f in writers]} write the record"
        assert ("file ring" in on) == bool(ring and point.typed)
        skb = parts.has_skb(point)
        assert ("track" in on) == (opts.ident == "track" and skb)
        assert ("packet ids" in on) == (opts.ident != "none" and skb)
        assert ("filter" in on) == (opts.filter is not None) and ("dumps" in on) == (opts.dumps is not None)
        assert ("predicates" in on) == bool(opts.predicates) and ("counts" in on)
        assert ("stack" in on) == opts.stack


def test_every_feature_is_on_in_some_configuration():
    """(So the configurations above build every feature's code.)"""
    seen = {f.name for c in CONFIGURATIONS for b in _builders(*c[1:]) for f in b.parts}
    assert seen == {f.name for f in cprog.PARTS} - (set() if ROOT_USER else {"verdict"})


def test_labels_come_from_fresh():
    """Every label of a built program is a fresh() name (a number no other label has), or made from one (the
    translated filter's, from its fresh() prefix), or the skeleton's "out": parts written apart cannot clash,
    whichever configuration builds them together."""
    import re

    from bpf.asm import Label
    fresh = re.compile(r"^[a-z][a-z0-9]*(_[a-z][a-z0-9]*)*_\d+(_\w+)?$")
    for c in CONFIGURATIONS:
        for b in _builders(*c[1:]):
            names = [it.name for it in b.items if isinstance(it, Label)]
            assert len(names) == len(set(names)), c[0]
            odd = [n for n in names if n != "out" and not fresh.match(n)]
            assert not odd, f"{c[0]}: {odd}"
