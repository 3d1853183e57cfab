"""Every shape of program fcap generates, loaded in this kernel (issue 42: a program fcap generates must be one any
correct verifier accepts). Each shape goes the capture's own way: fcap.live.planner.capture_config, then Session's
resolve, the features' refusal (fcap.features.config), write_file for a file, open (every program built and loaded,
through bpf.prog.load and its checks), attach where it is cheap, close. Shapes: each kind of point (fcap.points.kinds:
tp_btf, raw_tp, fentry, fexit, kprobe; the multi-attach kinds fentry.multi, fexit.multi, kprobe.multi; fentry/fexit
on XDP and tc programs) × the filters (none, one that reads packet bytes, one with a Linux ancillary load, every
ancillary field, a protochain loop, vlan) × each per-packet unit on its own (--track, --where, the predicates, --dump,
--ct, --stack, --context; at a drop point the drop's reason and --nft) and all of them at once × the outputs (printed,
pcap, pcapng, --perf-buffer, --no-comment, --no-skb-dynptr, -y, -s, several points into one pcapng). The points bring
the program features of their own: a transmit and a receive point at the device layer (the queue, the VLAN tag), a
drop point (the reason and location), a BPF program's exit (its verdict).

No traffic: what is checked is that each program loads. A kind of point this kernel refuses skips with the
refusal's line; a shape fcap itself refuses at a point, in one line before anything is loaded, and a preferred
program the kernel refused where a conservative variant (fcap.kernel.variants) loaded, are each named in a warning.
Anything else that keeps a shape from loading fails, with the verifier's line."""

from __future__ import annotations

import os
import time
import warnings
from typing import NamedTuple

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (loads BPF programs)")

AD = 0xFFFFF000           # cBPF's SKF_AD_OFF: a Linux ancillary field's load
BYTES = "udp port 53"     # a filter that reads the packet's bytes
ANCILLARY = "inbound"     # one with an ancillary load (the skb's pkt_type), at a receive point
EVERY_FIELD = "every ancillary field"   # a hand-made cBPF program loading each of them (libpcap makes only pkttype)
LOOP = "ip6 protochain 17"   # libpcap's loop: a bounded eBPF loop
VLAN = "vlan and udp"     # the VLAN tag put back into the bytes, then read
# -> (transmit at the device layer, receive at the device layer, another receive point, a drop point: None, a drop
# function from BTF; "": none, as at fexit, which fcap refuses where the function frees the skb: its memory may be
# another's by then)
ROLES = {
    "tp_btf": ("tp_btf/net_dev_queue", "tp_btf/netif_receive_skb", "tp_btf/netif_rx", "tp_btf/kfree_skb"),
    "raw_tp": ("raw_tp/net_dev_queue", "raw_tp/netif_receive_skb", "raw_tp/netif_rx", "raw_tp/kfree_skb"),
    "fentry": ("fentry/__dev_queue_xmit", "fentry/__netif_receive_skb", "fentry/ip_rcv", None),
    "fexit": ("fexit/__dev_queue_xmit", "fexit/__netif_receive_skb", "fexit/ip_rcv", ""),
    "kprobe": ("kprobe/__dev_queue_xmit", "kprobe/__netif_receive_skb", "kprobe/ip_rcv", None),
}
DROP_FUNCS = ("sk_skb_reason_drop", "kfree_skb_reason")   # the functions with an enum skb_drop_reason argument
# a multi-attach kind: the kind of its points; its programs' functions, out and in (two each: a group per direction)
MULTI = {"fentry.multi": "fentry", "fexit.multi": "fexit", "kprobe.multi": "kprobe"}
MULTI_OUT, MULTI_IN = ("__dev_queue_xmit", "ip_output"), ("__netif_receive_skb", "ip_rcv")
# -> the output's flags: (label, file format or None: printed, --perf-buffer, capture_config's fields)
OUTPUTS = (("printed", None, False, {}), ("-w x.pcap", "pcap", False, {}), ("-w x.pcapng", "pcapng", False, {}),
           ("-w x.pcap --perf-buffer", "pcap", True, {}), ("-w x.pcapng --perf-buffer", "pcapng", True, {}),
           ("-w x.pcapng --no-comment", "pcapng", False, {"comment": False}),
           ("-w x.pcap --no-skb-dynptr", "pcap", False, {"skb_dynptr": False}),
           ("-w x.pcapng --no-skb-dynptr", "pcapng", False, {"skb_dynptr": False}))


class Shape(NamedTuple):
    label: str
    points: list
    filter: str | None = None
    fmt: str | None = "pcapng"
    perf: bool = False
    said: dict = {}       # the predicates' and the features' flags (capture_config's said)
    fields: dict = {}     # capture_config's own fields (linktype, snaplen, track, comment)
    attach: bool = False  # attach too (then close)


class ShapeNotLoaded(UserWarning):
    """A shape fcap refuses at these points in one line, or one whose preferred program the kernel refused."""


def units(direction: str | None, skb: str = "skb", ret: bool = False) -> list[tuple[str, dict, dict]]:
    """(label, said, fields) of each per-packet unit on its own at a point going `direction` whose context argument
    is `skb`, `ret`: whose return value the program reads (fexit)."""
    from fcap.kernel.dumps import CT_PATH
    predicates = {"pid": os.getpid(), "comm": "fcap", "mark": 0, "ifindex": 1, "ifname": "lo",
                  "netns": os.stat("/proc/self/ns/net").st_ino, "cgroup": "/"}
    if direction:
        predicates["direction"] = direction
    where = [f"{skb}->len > 0", f'{skb}->dev->name == "lo"'] + (["return >= 0"] if ret else [])
    dump = [f"{skb}->dev", f"{skb}->len"] + (["return"] if ret else [])
    members = [f"{skb}->dev->name", f"{skb}->len"] + (["return"] if ret else [])   # (their options fit the rings)
    return [("--track", {}, {"track": True}), ("--where", {"where": where}, {}), ("predicates", predicates, {}),
            ("--dump", {"dump": dump}, {}), ("--ct", {"dump": [CT_PATH]}, {}), ("--stack", {"stack": True}, {}),
            ("--context", {"context": True}, {}), ("--dump members", {"dump": members}, {})]


def all_of(us: list[tuple[str, dict, dict]]) -> tuple[dict, dict]:
    said, fields = {}, {}
    for _label, s, f in us:
        for k, v in s.items():
            said[k] = said.get(k, []) + v if isinstance(v, list) else v
        fields.update(f)
    return said, fields


XDP_FIELDS = (0, 4, 8, 36, 56)   # what an XDP packet has of them (fcap.kernel.xdpprog): protocol, pkttype, ifindex,
                                 # cpu, random


def every_field_program(points) -> list[tuple[int, int, int, int]]:
    """Each ancillary field fcap serves at `points` loaded and compared in turn (pkttype only where the points'
    direction makes it mean something); the last returns the snap length."""
    from bpf.cbpf import ANCILLARY as FIELDS
    from fcap.kernel.ancillary import REFUSED
    xdp = not any(p.kind.on_skb for p in points)
    direction = all(p.direction for p in points)
    fields = [f for f in FIELDS if f not in REFUSED and f != 40 and (direction or f != 4)   # (40: not a load)
              and (not xdp or f in XDP_FIELDS)]
    n = len(fields)
    prog = []
    for j, f in enumerate(fields):
        prog += [(0x20, 0, 0, AD + f), (0x15, 2 * (n - j) - 1, 0, 0xDEADBEEF)]   # ld [AD + f]; jeq -> ret 0
    return prog + [(0x06, 0, 0, 262144), (0x06, 0, 0, 0)]


def load(shape: Shape) -> tuple[str, object]:
    """("loaded", what it loaded), or ("refused", fcap's one line refusing the shape before anything loads)."""
    from bpf.cbpf import validate
    from fcap.errors import FcapError
    from fcap.features.config import refusal
    from fcap.live.planner import capture_config
    from fcap.live.session import Session
    text = shape.filter if shape.filter != EVERY_FIELD else None
    try:
        cfg = capture_config(shape.points, shape.said.get, filter=text, **shape.fields)
        s = Session(cfg)
    except FcapError as e:
        return "refused", str(e)
    try:
        try:
            s.resolve()
            if shape.filter == EVERY_FIELD:
                s.cbpf = validate(every_field_program(s.points))
            why = refusal(s.cfg, s.points, shape.fmt)
            if why:
                return "refused", why
            if shape.fmt is not None:
                s.write_file(shape.fmt, shape.perf)
        except FcapError as e:
            return "refused", str(e)
        s.open()
        if shape.attach:
            s.attach()
        return "loaded", {"programs": len(s.programs) + len(s.helpers), "units": [u.kind for u, _p in s.loaded],
                          "fallbacks": dict(getattr(s, "fallbacks", {})), "ring": s.ring is not None}
    finally:
        s.close()


def built_alone(shape: Shape) -> str | None:
    """Whether fcap's own building (--dump-ebpf's: nothing loaded) refuses the shape: its line, or None."""
    from bpf.cbpf import validate
    from fcap.errors import FcapError
    from fcap.live.planner import capture_config
    from fcap.live.session import Session
    text = shape.filter if shape.filter != EVERY_FIELD else None
    s = Session(capture_config(shape.points, shape.said.get, filter=text, **shape.fields))
    s.resolve()
    if shape.filter == EVERY_FIELD:
        s.cbpf = validate(every_field_program(s.points))
    if shape.fmt is not None:
        s.write_file(shape.fmt, shape.perf)
    try:
        s.dump()
    except FcapError as e:
        return str(e)
    return None


def run_shapes(name: str, shapes: list[Shape], check=None) -> list:
    """Load each shape; skip when the kernel refuses the kind of point altogether (the first shape's refusal); warn
    of the shapes fcap refuses here and of the conservative variants; fail with each shape that did not load.
    `check(shape, what)`: a further line of failure for a loaded shape, or None."""
    from fcap.errors import CaptureError
    from fcap.live.attach import KernelRefusal
    loaded, failed, notes = [], [], []
    t0 = time.monotonic()
    for sh in shapes:
        where = f"{name} {sh.label} at {' '.join(sh.points)}"
        try:
            status, what = load(sh)
        except KernelRefusal as e:
            if not loaded and not failed:
                pytest.skip(f"{name}: {e}")
            failed.append(f"{where}: {e}")
            continue
        except CaptureError as e:   # (loading or attaching: the verifier's line, or the kernel's refusal)
            alone = built_alone(sh)
            if alone is not None:
                notes.append(f"{where}: fcap refuses it here: {alone}")
            else:
                failed.append(f"{where}: {e}")
            continue
        if status == "refused":
            notes.append(f"{where}: fcap refuses it here: {what}")
            continue
        why = check(sh, what) if check is not None else None
        if why:
            failed.append(f"{where}: {why}")
            continue
        loaded.append(sh)
        for note in what["fallbacks"].values():
            notes.append(f"{where}: a conservative variant: {note}")
    for note in notes:
        warnings.warn(ShapeNotLoaded(note))
    print(f"\n{name}: {len(loaded)} of {len(shapes)} shapes loaded ({sum(s.attach for s in loaded)} attached) in "
          f"{time.monotonic() - t0:.1f} s; {len(notes)} notes")
    assert not failed, "\n".join([f"{len(failed)} of {len(shapes)} shapes did not load:"] + failed)
    return loaded


def drop_function() -> str:
    from bpf.btf import BTF
    vm = BTF.vmlinux()
    name = next((f for f in DROP_FUNCS if vm.find(f, "func") is not None), None)
    if name is None:
        pytest.skip(f"no drop function ({', '.join(DROP_FUNCS)}) in this kernel's BTF")
    return name


def point_shapes(kind: str, out: str, inp: str, inp2: str, drop: str) -> list[Shape]:
    """A single kind's shapes (see the module's docstring)."""
    ret = kind == "fexit"   # (__dev_queue_xmit and __netif_receive_skb return an int)
    out_units, in_units = units("out", ret=ret), units("in", ret=ret)
    shapes = [Shape(label, [out], None, fmt, perf, {}, fields, attach=label == "printed")
              for label, fmt, perf, fields in OUTPUTS]
    shapes += [Shape(f"'{BYTES}'", [out], BYTES), Shape(f"'{BYTES}' printed", [out], BYTES, None),
               Shape(f"'{BYTES}' -w x.pcap", [out], BYTES, "pcap"),
               Shape(f"'{BYTES}' --perf-buffer", [out], BYTES, perf=True),
               Shape(f"'{BYTES}' --no-skb-dynptr", [out], BYTES, fields={"skb_dynptr": False}),
               Shape(f"'{ANCILLARY}'", [inp], ANCILLARY), Shape(f"'{ANCILLARY}' printed", [inp], ANCILLARY, None),
               Shape(EVERY_FIELD, [inp], EVERY_FIELD), Shape(f"'{LOOP}'", [out], LOOP), Shape(f"'{VLAN}'", [inp], VLAN)]
    shapes += [Shape(f"-y {lt} '{BYTES}'", [out], BYTES, fields={"linktype": lt})
               for lt in ("LINUX_SLL2", "IPV4", "RAW")]
    shapes.append(Shape(f"-s 64 '{BYTES}'", [out], BYTES, fields={"snaplen": 64}))
    for (label, said, fields), (_l, in_said, in_fields) in zip(out_units, in_units):
        shapes.append(Shape(label, [out], None, said=said, fields=fields))
        if label != "--stack":   # (its part is the same whatever the filter; its frames' names cost ~2 s in a guest)
            shapes += [Shape(f"{label} '{BYTES}'", [out], BYTES, said=said, fields=fields),
                       Shape(f"{label} '{ANCILLARY}'", [inp], ANCILLARY, said=in_said, fields=in_fields)]
    for us, point, filt in ((out_units, out, None), (out_units, out, BYTES), (in_units, inp, ANCILLARY)):
        said, fields = all_of(us)
        shapes.append(Shape(f"every unit '{filt or ''}'", [point], filt, said=said, fields=fields, attach=True))
    # every unit the file rings take (whole structures' dumps do not: their options are too long), the texts user
    # space gives their programs among them
    said, fields = all_of([u for u in out_units if u[0] not in ("--dump", "--ct")])
    shapes += [Shape(f"every unit of the rings '{BYTES}'", [out], BYTES, said=said, fields=fields),
               Shape(f"every unit of the rings '{BYTES}' --no-skb-dynptr", [out], BYTES, said=said,
                     fields={**fields, "skb_dynptr": False})]
    # several points into one pcapng (ISBs: each point counts its records; packet ids from the identity map)
    shapes += [Shape("several points", [out, inp], None, attach=True),
               Shape(f"several points '{BYTES}'", [out, inp], BYTES),
               Shape(f"several points '{ANCILLARY}'", [inp, inp2], ANCILLARY)]
    if not drop:
        return shapes
    # a drop point: the reason and location; --nft (its trace socket's program, and the rule's key in the record)
    drop_units = [u for u in units(None) if u[0] != "--stack"] + [("--nft", {"nft": True}, {})]
    shapes += [Shape("drop", [drop], None, attach=True), Shape(f"drop '{BYTES}'", [drop], BYTES),
               Shape("drop printed", [drop], None, None)]
    shapes += [Shape(f"drop {label}", [drop], BYTES, said=said, fields=fields) for label, said, fields in drop_units]
    said, fields = all_of(drop_units + [u for u in units(None) if u[0] == "--stack"])
    rings = all_of([u for u in drop_units if u[0] not in ("--dump", "--ct")] +
                   [u for u in units(None) if u[0] == "--stack"])   # (the drop's, the rule's, the dumps' texts given)
    shapes += [Shape(f"drop every unit of the rings '{BYTES}'", [drop], BYTES, said=rings[0], fields=rings[1]),
               Shape(f"drop every unit of the rings '{BYTES}' --no-skb-dynptr", [drop], BYTES, said=rings[0],
                     fields={**rings[1], "skb_dynptr": False})]
    shapes += [Shape(f"drop every unit '{BYTES}'", [drop], BYTES, said=said, fields=fields, attach=True),
               Shape(f"several points and a drop point '{BYTES}'", [out, inp, drop], BYTES),
               Shape(f"several points and a drop point '{BYTES}' printed", [out, inp, drop], BYTES, None)]
    return shapes


@pytest.mark.parametrize("kind", list(ROLES))
def test_every_shape_at(kind):
    """Each shape at points of `kind` (one program per point) loads."""
    out, inp, inp2, drop = ROLES[kind]
    drop = f"{kind}/{drop_function()}" if drop is None else drop
    run_shapes(kind, point_shapes(kind, out, inp, inp2, drop))


@pytest.mark.parametrize("name", list(MULTI))
def test_every_shape_of_a_multi_attach_program(name):
    """Several functions of one kind through one multi-attach link where the kernel has one: a program that takes
    the point from the attach cookie (the skb's argument, the direction, the queue, a drop's reason). Only what
    keeps one program for the group (--where and --dump read arguments per point, --stack skips frames per kind:
    a program per point, test_every_shape_at's)."""
    from fcap.live import multi
    from fcap.points import kinds
    m, single = kinds.MULTI[[k.name for k in kinds.MULTI].index(name)], kinds.get(MULTI[name])
    got = multi.multi_kind(single)
    if got is not m:
        why = m.probe()
        pytest.skip(f"{name}: " + (why.reason if why is not None else f"{single} points go through {got} here"))
    drop = () if single.sees_return else (drop_function(),)   # (fexit at a free: see ROLES)
    everywhere = [f"{single}/{f}" for f in MULTI_OUT + MULTI_IN + drop]
    inward = [f"{single}/{f}" for f in MULTI_IN]
    keep = ("--track", "predicates", "--context")
    us, in_us = ([u for u in units(d) if u[0] in keep] for d in (None, "in"))
    shapes = [Shape(label, everywhere, None, fmt, perf, {}, fields, attach=label == "printed")
              for label, fmt, perf, fields in OUTPUTS]
    shapes += [Shape(f"'{BYTES}'", everywhere, BYTES), Shape(f"'{ANCILLARY}'", inward, ANCILLARY),
               Shape(EVERY_FIELD, inward, EVERY_FIELD), Shape(f"'{LOOP}'", everywhere, LOOP),
               Shape(f"-y EN10MB '{VLAN}'", inward, VLAN, fields={"linktype": "EN10MB"}),
               Shape(f"-y RAW '{BYTES}'", everywhere, BYTES, fields={"linktype": "RAW"})]
    for (label, said, fields), (_l, in_said, in_fields) in zip(us, in_us):
        shapes += [Shape(label, everywhere, None, said=said, fields=fields),
                   Shape(f"{label} '{BYTES}'", everywhere, BYTES, said=said, fields=fields),
                   Shape(f"{label} '{ANCILLARY}'", inward, ANCILLARY, said=in_said, fields=in_fields)]
    for points, filt, (said, fields) in ((everywhere, None, all_of(us)), (everywhere, BYTES, all_of(us)),
                                         (inward, ANCILLARY, all_of(in_us))):
        shapes.append(Shape(f"every unit '{filt or ''}'", points, filt, said=said, fields=fields, attach=True))

    def one_program(shape, what):
        return None if m in what["units"] else f"no {name} program among {[str(k) for k in what['units']]}"
    run_shapes(name, shapes, check=one_program)


@pytest.fixture(params=["xdp", "tc"])
def bpf_program(request, root):
    """A loaded XDP or tc program of the tests' own (tests/bpfprogs.py), attached nowhere: fcap's points on it."""
    from bpf.uapi import ProgType
    from bpfprogs import TestProgram
    prog_type = ProgType.XDP if request.param == "xdp" else ProgType.SCHED_CLS
    prog = TestProgram(prog_type, f"fcap_s{request.param[0]}{os.getpid() % 100000}", 9, 10)
    try:
        yield request.param, prog
    finally:
        prog.close()


def test_every_shape_on_a_bpf_program(bpf_program):
    """fentry and fexit on an XDP or a tc program (xdp/PROG, tc/PROG: both ends, the exit's verdict)."""
    word, prog = bpf_program
    spec = f"{word}/{prog.name}"
    xdp = word == "xdp"
    arg = "xdp" if xdp else "skb"
    # an XDP program's context is no skb: what reads one (--track's ids, --context's socket, --ct) says nothing there
    us = [u for u in units("in" if xdp else None, arg) if not xdp or u[0] in ("predicates", "--stack")]
    if xdp:
        us += [("--where", {"where": ["xdp->data_end > 0"]}, {}), ("--dump", {"dump": ["xdp->rxq"]}, {})]
    shapes = [Shape(label, [spec], None, fmt, perf, {}, fields, attach=label == "printed")
              for label, fmt, perf, fields in OUTPUTS]
    shapes += [Shape(f"'{BYTES}'", [spec], BYTES), Shape(f"'{BYTES}' printed", [spec], BYTES, None),
               Shape(f"'{LOOP}'", [spec], LOOP), Shape(f"'{VLAN}'", [spec], VLAN),
               Shape(EVERY_FIELD, [spec], EVERY_FIELD)]
    if xdp:   # (a tc program sees both directions, as attached)
        shapes.append(Shape(f"'{ANCILLARY}'", [spec], ANCILLARY))
    for label, said, fields in us:
        shapes += [Shape(label, [spec], None, said=said, fields=fields),
                   Shape(f"{label} '{BYTES}'", [spec], BYTES, said=said, fields=fields)]
    said, fields = all_of(us)
    shapes.append(Shape(f"every unit '{BYTES}'", [spec], BYTES, said=said, fields=fields, attach=True))
    run_shapes(word, shapes)


def test_every_kind_of_point_has_its_shapes():
    """A kind of point added to fcap.points.kinds gets its shapes here too."""
    from fcap.points import kinds
    covered = set(ROLES) | set(MULTI) | {f"{w}.{end}" for w in ("xdp", "tc") for end in ("entry", "exit")}
    assert {k.name for k in kinds.ALL + kinds.MULTI} == covered
