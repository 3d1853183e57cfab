"""What a capture is, before anything is loaded: its points resolved, the link type, the filter compiled, which
points share a program (fcap.live.multi), each program's options and the maps they use (MapPlan). The generated
programs (build, and dump for --dump-ebpf) come from here; fcap.live.session.Session makes and runs them."""

from __future__ import annotations

import collections
import itertools
import os
from typing import Callable, NamedTuple

from bpf import probes
from bpf.btf import BTF, BTFError
from bpf.errors import BPFError
from bpf.maps import online_cpus
from bpf.perfbuf import PAGE

from fcap.defaults import SNAPLEN, TRACK_MAX, buffer_kib, check_snaplen
from fcap.errors import CaptureError, PointError, PredicateError
from fcap.features import FEATURES, FLAGGED, selectors
from fcap.files.linktypes import ETH_P_IP, ETH_P_IPV6, LinkType, loaded16, lookup
from fcap.kernel import ancillary, builders, drops, layout, ringrec, stats, track, variants
from fcap.kernel import program as cprog
from fcap.kernel.parts import has_skb
from fcap.kernel.filter import compile_filter
from fcap.live import multi
from fcap.points import kinds, pointcaps, progpoints
from fcap.points.spec import Point, expand, is_glob, resolve

START_FOR = {"EN10MB": cprog.START_MAC, "RAW": cprog.START_NETWORK, "IPV4": cprog.START_NETWORK,
             "IPV6": cprog.START_NETWORK, "LINUX_SLL2": cprog.START_SLL2, "IEEE802_11": cprog.START_MAC}
PROTO_FOR = {"IPV4": ETH_P_IP, "IPV6": ETH_P_IPV6}


# A capture's configuration (Config): these fields, then one per flagged feature and one per setting, named and
# valued as the unit says (fcap.features: False or its values; a setting's values), by fcap.features.config.asked.
_CONFIG = (
    ("points", None),         # -i POINTs, as given
    ("linktype", None),       # -y's name (None: default_linktype)
    ("snaplen", SNAPLEN),
    ("filter", None),         # tcpdump's expression
    ("buffer_kib", 0),        # -B, all CPUs together (0: fcap.defaults.buffer_kib for this machine's CPUs)
    ("immediate", False),
    ("predicates", ()),       # factories: Point -> predicate (see fcap.kernel.predicates)
    ("record", layout.RECORD_PCAP),   # the file record header the programs lay out (pcap or pcapng)
    ("file_ring", False),     # pcap records straight into per-CPU file rings where the kernel allows it
    ("skb_dynptr", True),     # skb dynptrs where the kernel has them (False: as a kernel before 6.12, --no-skb-dynptr)
    ("file", False),          # the capture writes a file (its drain: fcap.live.drain's)
    ("meta", True),           # the programs record pid/tid, comm, mark, netns (unused when a pcap file is written)
    ("track", False),         # --track (fcap.kernel.track): follow what the filter chose to every point until freed
    ("track_max", TRACK_MAX),
    ("comment", True),        # pcapng records carry the metadata comment (--no-comment: they do not)
)
_UNITS = tuple((f.name, () if f.metavar else False) for f in FLAGGED) + tuple(
    (s.name, ()) for f in FLAGGED for s in f.settings)
_FIELDS = _CONFIG + _UNITS
Config = collections.namedtuple("Config", [n for n, _v in _FIELDS], defaults=[v for _n, v in _FIELDS[1:]])
Config.__doc__ = "A capture's configuration: fcap.live.planner._CONFIG's fields, then the units' (fcap.features)."
# what the predicates are asked with: the command line's flags and the API's keywords (fcap.kernel.predicates)
PREDICATES = ("where", "direction", "cgroup", "container") + selectors.NAMES


def capture_config(points: list[str], said: Callable[[str], object], **fields) -> Config:
    """The one way the command line's flags and the API's keywords become a capture's Config: `fields` its own
    (_CONFIG's: linktype, snaplen, filter, ...), `said(name)` what the flag or keyword of a predicate (PREDICATES)
    or a feature (fcap.features.config.asked) said. UsageError: a snaplen no capture takes; UnknownLinkType;
    PredicateError: a predicate's value no program can test."""
    from fcap.features.config import asked
    from fcap.kernel import predicates
    if fields.get("linktype") is not None:
        lookup(fields["linktype"])   # (UnknownLinkType before any work)
    check_snaplen(fields.get("snaplen", SNAPLEN))
    tests = {name: said(name) for name in PREDICATES if said(name) not in (None, (), [])}
    preds = predicates.factories(**tests) if tests else []   # (a capture without them starts sooner)
    return Config(points=points, predicates=preds, **fields, **asked(said))


def default_linktype(points: list[Point]) -> LinkType:
    """EN10MB where every point is at the device layer (a MAC header is in place); LINUX_SLL2 elsewhere,
    which decodes for any protocol and carries the interface and direction."""
    if all(p.device_layer for p in points):
        return lookup("EN10MB")
    return lookup("LINUX_SLL2")


class Planner:
    """A capture's plan (see the module's docstring); Session adds the kernel's objects and runs it."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.points: list[Point] = []
        self.linktype: LinkType | None = None
        self.cbpf: list | None = None
        self.groups: list[multi.Group] = []   # the points by program: one each, or a multi-attach group
        self.dump_area = None     # fcap.kernel.dumps.Area when --dump PATHs are copied into the records
        self.parse = layout.parse_record   # a perf sample -> Record
        self.skipped: list[tuple[str, str]] = []   # (point, why) of glob matches the kernel refused
        self.clock_offset_ns = 0   # wall clock less monotonic, sampled once when the programs are made
        self.counts_hits = False   # the programs count hits (else hits == seen)
        self.given_up: set[str] = set()    # options of conservative variants in force (fcap.kernel.variants)
        self.fallbacks: dict[str, str] = {}   # variant option -> the one-line note of why it is in force

    @property
    def lead(self) -> int:
        """The bytes each perf sample holds before its META: the dump area's (fcap.kernel.dumps.Area)."""
        return self.dump_area.size if self.dump_area is not None else 0

    def resolve(self) -> None:
        if not os.path.exists("/sys/kernel/btf/vmlinux"):
            raise CaptureError("this kernel has no BTF (/sys/kernel/btf/vmlinux): fcap needs CONFIG_DEBUG_INFO_BTF")
        try:
            seen: set[str] = set()
            for spec in self.cfg.points:
                for p in self._points_of(spec):
                    if p.spec not in seen:   # (globs may overlap)
                        seen.add(p.spec)
                        p.id = len(self.points)
                        self.points.append(p)
        except PointError as e:
            raise CaptureError(str(e)) from None
        except BTFError as e:
            raise CaptureError(f"reading the kernel's BTF: {e}") from None
        if self.cfg.dump:
            from fcap.kernel.dumps import make_area
            self.dump_area = make_area(self.points, self.cfg.dump)
            self.parse = self.dump_area.parse
        self.linktype = lookup(self.cfg.linktype) if self.cfg.linktype else default_linktype(self.points)
        if self.linktype.name not in START_FOR:
            raise CaptureError(f"link-type {self.linktype.name} cannot be made from an skb; use one of "
                               f"{', '.join(START_FOR)}")
        if self.cfg.filter:
            from fcap.kernel.filter import FilterError
            try:
                self.cbpf = compile_filter(self.cfg.filter, self.linktype, self.cfg.snaplen)
            except FilterError as e:
                raise CaptureError(f"{self.cfg.filter}: {e}") from None

    def write_file(self, fmt: str, perf_buffer: bool = False) -> None:
        """The capture writes a `fmt` file (pcap or pcapng; which one is known once the points are): the programs lay
        out its record headers, write finished records themselves where they can (unless `perf_buffer`), and record
        metadata only where the file keeps it. Once resolved, before anything is planned."""
        assert self.points and not self.groups, "write_file: after resolve(), before map_plan()"
        self.cfg = self.cfg._replace(record=fmt, file=True, file_ring=not perf_buffer, meta=fmt != layout.RECORD_PCAP)

    def _points_of(self, spec: str) -> list[Point]:
        """What one -i names: a semantic point's hooks, a glob's matches, or one point."""
        from fcap.points.semantic import is_semantic, resolve_semantic
        if is_semantic(spec):
            return resolve_semantic(spec)
        if progpoints.is_program_spec(spec):
            return progpoints.resolve(spec)
        kind = self._best_function_kind(spec)
        return expand(spec, kind) if is_glob(spec) else [resolve(spec, default_func_kind=kind)]

    def _best_function_kind(self, spec: str) -> kinds.Kind:
        """For a bare FUNC: fentry where the kernel allows it, else kprobe, else fentry (to say why not)."""
        if "/" in spec:
            return kinds.FENTRY
        try:
            vm = BTF.vmlinux()
            func = vm.find("ip_output" if is_glob(spec) else spec.partition(":")[0], "func")
            if func is None:
                return kinds.FENTRY
            if kinds.FENTRY.probe(func.id) is None:
                return kinds.FENTRY
            if kinds.KPROBE.probe() is None:
                return kinds.KPROBE
        except (BTFError, BPFError):
            pass
        return kinds.FENTRY

    def predicates(self, point: Point) -> list:
        """The predicates built for `point` (CaptureError: one it cannot have, e.g. an argument it lacks)."""
        try:
            return [make(point) for make in self.cfg.predicates]
        except (PredicateError, PointError) as e:   # (PointError: an argument this kind cannot read here)
            raise CaptureError(str(e)) from None

    def options(self, point: Point) -> cprog.ProgramOptions:
        preds = self.predicates(point)
        want = PROTO_FOR.get(self.linktype.name)
        if want is not None:
            preds.insert(0, protocol_predicate(want))
        return variants.without(self._preferred_options(point, preds), self.given_up)

    def _preferred_options(self, point: Point, preds: list) -> cprog.ProgramOptions:
        return cprog.ProgramOptions(start=START_FOR[self.linktype.name], snaplen=self.cfg.snaplen, filter=self.cbpf,
                             dynptr_kfunc=self._dynptr_kfunc(point) if self.cbpf is not None else 0,
                             predicates=preds, record=self.cfg.record, clock_offset_ns=self.clock_offset_ns,
                             meta=self.cfg.meta, task_btf=self.cfg.meta and pointcaps.task_btf(point),
                             dumps=self.dump_area.for_point(point) if self.dump_area is not None else None,
                             head_loads=pointcaps.head_loads(point), count_seen=self.counts_ring_records(),
                             ident=self.ident(), points=len(self.points),
                             starts_inside_free=track.only_inside_free(self.points), comment=self.cfg.comment,
                             **{f.name: getattr(self.cfg, f.name) for f in FLAGGED if f.option},
                             division_tracked=self.cbpf is not None and probes.division_ranges() is None)

    def ident(self) -> str:
        """How records get their packet ids (fcap.kernel.track.mode)."""
        # (counted up to two, all it tells apart: options() asks once per point, and a glob makes thousands)
        skb_points = sum(1 for _p in itertools.islice((p for p in self.points if has_skb(p)), 2))
        return track.mode(self.cfg.track, skb_points, self.cfg.meta)

    def counts_ring_records(self) -> bool:
        """Whether programs writing the file rings count each point's records too (an ISB per point says how many
        it kept): for several points into one pcapng file. (One point's count is the rings' count of records.)"""
        return self.cfg.record == layout.RECORD_PCAPNG and len(self.points) > 1

    def build(self, point: Point, maps: cprog.Maps) -> list:
        from bpf.cbpf import CBPFError
        try:
            opts = self.options(point)
            self.counts_hits = stats.counts_hits(opts)
            return builders.build(point, opts, maps)
        except (cprog.ProgramError, PredicateError, PointError) as e:
            raise CaptureError(str(e)) from None
        except CBPFError as e:   # what the filter asks that fcap cannot run at this point
            raise CaptureError(f"{self.cfg.filter or 'the filter'}: {e}") from None

    def _skip_unbuildable(self) -> None:
        """Glob matches the predicates cannot be built for (an argument some matches lack) are skipped."""
        kept = []
        for p in self.points:
            try:
                self.predicates(p)
                kept.append(p)
            except CaptureError as e:
                if not p.origin:
                    raise
                self.skipped.append((p.spec, str(e)))
        if not kept:
            raise CaptureError(self.skipped[0][1])
        self.points = kept

    def plan(self) -> list[multi.Group]:
        """The points by program (fcap.live.multi): many functions of one kind share a program and a link where the
        kernel has a multi-attach link for them and the program does per point only what the attach cookie says."""
        # --stack keeps a program per point too: its frames to skip are known per single kind (fcap.kernel.kstack)
        per_point_args = self.dump_area is not None or self.cfg.stack or any(getattr(m, "reads_args", False)
                                                                             for m in self.cfg.predicates)
        by_direction = ancillary.reads_direction(self.cbpf) or any(getattr(m, "by_direction", False)
                                                                   for m in self.cfg.predicates)
        return multi.plan(self.points, allowed=not per_point_args, by_direction=by_direction)

    def _program_points(self) -> list[Point]:
        """The points the programs are built for: each one-point group's point, or a group's stand-in."""
        return [g.points[0] if g.kind is None else multi.stand_in(g.kind, g.points) for g in self.groups]

    def _helper_programs(self, maps: cprog.Maps):
        """The identity map's helpers (fcap.kernel.track): programs where the kernel frees that end its entries;
        with --track, those where it copies a packet."""
        opts = cprog.ProgramOptions(start=cprog.START_DATA, snaplen=0, ident=self.ident())
        return track.helpers(self.points, len(self.points), lambda p: cprog.Builder(p, opts, maps),
                             copies=self.ident() == track.IDENT_TRACK)

    def _pages(self, ncpus: int) -> int:
        """Pages per CPU (a power of two) for -B KiB shared by the CPUs (its default: fcap.defaults.buffer_kib)."""
        kib = self.cfg.buffer_kib or buffer_kib(ncpus, self.cfg.record == layout.RECORD_PCAPNG)
        per_cpu = max(kib * 1024 // max(ncpus, 1) // PAGE, 8)
        return 1 << (per_cpu.bit_length() - 1)

    def _dynptr_kfunc(self, point: Point) -> int:
        """bpf_dynptr_from_skb's BTF id where the point's program may call it (0: none, or --no-skb-dynptr)."""
        return pointcaps.dynptr_kfunc(point) if self.cfg.skb_dynptr else 0

    def _file_rings(self) -> tuple[bool, int]:
        """Whether the records go to file rings (asked for, every point BTF-typed, nothing only user space can lay
        out, a head the programs can publish), and bpf_dynptr_from_skb's BTF id for the bytes in page frags: 0 when
        the kernel has no skb dynptrs for these points, whose packets with bytes in frags then go through the perf
        buffer (fcap.kernel.ringrec.frags_by_perf)."""
        if not (self.cfg.file_ring and not self.cfg.immediate):
            return False, 0
        if any(p.copies_bytes or p.kind.on_program for p in self.points) or \
                any(g.kind is not None for g in self.groups):
            return False, 0   # (an skb the helpers take at every point; one program per point)
        if any(f.user_space(self.cfg, self.points) for f in FEATURES if f.user_space is not None):
            return False, 0   # (a feature says what only user space can: --dump's options without pcapng's comments;
            #  the texts of --context, --stack, --nft, --dump and a drop ride the rings: maps user space fills,
            #  fcap.kernel.ringrec)
        ids = {self._dynptr_kfunc(p) for p in self.points}
        kfunc = ids.pop() if len(ids) == 1 and 0 not in ids else 0
        return ringrec.can_publish(), kfunc

    def map_plan(self) -> MapPlan:
        """The maps the programs use, decided once for open() (which makes them) and dump() (which names them)."""
        self.groups = self.groups or self.plan()
        cpus = online_cpus()
        pages = self._pages(len(cpus))
        rings, kfunc = self._file_rings()
        texts = rings and self.cfg.comment and self.cfg.record == layout.RECORD_PCAPNG
        return MapPlan(scratch_size=max(cprog.scratch_size(p, self.options(p)) for p in self._program_points()),
                       track=self.ident() != track.IDENT_NONE, stack=self.cfg.stack, cpus=cpus, pages=pages,
                       kfunc=kfunc, ring_size=min(pages * PAGE, layout.RING_MAX) if rings else 0,
                       context=bool(texts and self.cfg.context), stack_texts=bool(texts and self.cfg.stack),
                       drop_texts=bool(texts and any(drops.is_drop_point(p) for p in self.points)),
                       nft=bool(self.cfg.nft), dump_texts=bool(texts and self.cfg.dump))

    def dump(self) -> str:
        """The generated programs, disassembled (for --dump-ebpf), over map fds that name each map open() makes."""
        from bpf import asm
        plan = self.map_plan()
        maps = cprog.Maps(events=-1, scratch=-2, counters=-3, scratch_size=plan.scratch_size)
        if plan.track:
            maps.track, maps.track_counters = -5, -6
        if plan.stack:
            maps.stack = -7
        if plan.nft:   # (-12: the trace socket's slots, -13: the rules' texts)
            maps.nftslot, maps.nfttext = -12, -13
        if plan.ring_size:   # the programs that write the file rings (map fd -4; -8: the perf buffer of packets with
            maps.ring, maps.ring_size, maps.dynptr_kfunc = -4, plan.ring_size, plan.kfunc   # bytes in frags, or
            maps.frags = 0 if plan.kfunc and not plan.gives else -8                          # texts to give; -9:
            maps.ctxtext = -9 if plan.context else 0                                          # --context's names,
            maps.stktext = -10 if plan.stack_texts else 0                                     # -10: --stack's,
            maps.droptext = -11 if plan.drop_texts else 0                                     # -11: a drop's,
            maps.dumptext = -14 if plan.dump_texts else 0                                     # -14: --dump's)
        out = []
        for group, p in zip(self.groups, self._program_points()):
            if group.kind is None:
                out.append(f"; {p.spec}: {p.prototype()}  (skb: argument {p.skb_index})")
            else:
                out.append(f"; {group.kind}: {len(group.points)} functions ({group.points[0].name}, ...) in one link, "
                           f"the attach cookie the point id and its bits (skb: argument {p.skb_index})")
            out.append(asm.disassemble(self.build(p, maps)))
        if track.uses_map(self.ident()):
            for p, items in self._helper_programs(maps):
                out.append(f"; {p.spec}: the identity map forgets what is freed here (nothing captured)")
                out.append(asm.disassemble(items))
        return "\n".join(out)


class MapPlan(NamedTuple):
    """What maps a capture's programs use (Planner.map_plan): the scratch value's size, the tracking maps, the
    stack map, the online CPUs and the buffer's pages per CPU, and the file rings (each CPU's ring size asked for, 0:
    none; kfunc: bpf_dynptr_from_skb's BTF id, 0 for none: packets with bytes in frags through the perf buffer)."""

    scratch_size: int
    track: bool
    stack: bool
    cpus: list
    pages: int
    kfunc: int
    ring_size: int
    context: bool = False   # the file rings' comments end with --context's names (a map user space fills)
    stack_texts: bool = False   # ... and with --stack's frames (another)
    drop_texts: bool = False    # ... and at drop points with a drop's names (another)
    nft: bool = False           # --nft: the trace socket's slots and the rules' texts (fcap.kernel.nftfilter)
    dump_texts: bool = False    # the file rings' options end with --dump's (another map user space fills)

    @property
    def gives(self) -> bool:
        """Whether user space gives the programs texts (whose records go through the perf buffer until it has)."""
        return self.context or self.stack_texts or self.drop_texts or self.nft or self.dump_texts


def protocol_predicate(ethertype: int) -> Callable:
    """Keep only packets whose skb->protocol is `ethertype` (for the IPV4/IPV6 linktypes); where the kernel has not
    set it yet, the IP version says."""
    from bpf.asm import JNE, R8, H, jmp

    def emit(b: cprog.Builder) -> list:
        b.read(H, R8, cprog.R6, b.offsets.protocol)
        b.protocol_from_version()
        return [jmp(JNE, R8, loaded16(ethertype), "out")]
    return emit
