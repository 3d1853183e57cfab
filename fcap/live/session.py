"""A capture session: resolve points, build and load programs, attach, drain the buffers, count, detach."""

from __future__ import annotations

import errno
import itertools
import os
import time
from typing import Callable, NamedTuple

from bpf import features
from bpf.btf import BTF, BTFError
from bpf.errors import BPFError
from bpf.link import Link
from bpf.maps import ArrayMap, PerCPUArrayMap, PerfEventArrayMap, online_cpus, possible_cpus
from bpf.perfbuf import PAGE, PerfBuffer
from bpf.prog import Program, wait_freed
from bpf.uapi import MapFlags

from fcap.kernel import ancillary, layout

from fcap.points import kinds, pointcaps, progpoints

from fcap.kernel import stats

from fcap.kernel import track
from fcap.kernel import builders, program as cprog
from fcap.kernel.feature import has_skb
from fcap.kernel.filter import compile_filter
from fcap.files.linktypes import ETH_P_IP, ETH_P_IPV6, LinkType, loaded16, lookup
from fcap.points.spec import Point, expand, is_glob, resolve
from fcap.kernel.drops import is_drop_point
from fcap.live import multi
from fcap.live.attach import Attach
from fcap.live.order import Pending, Window
from fcap.defaults import POLL_MS, POLL_MS_IMMEDIATE, SNAPLEN, TRACK_MAX, buffer_kib, check_snaplen
from fcap.errors import CaptureError, PointError, PredicateError


START_FOR = {"EN10MB": cprog.START_MAC, "RAW": cprog.START_NETWORK, "IPV4": cprog.START_NETWORK,
             "IPV6": cprog.START_NETWORK, "LINUX_SLL2": cprog.START_SLL2, "IEEE802_11": cprog.START_MAC}
PROTO_FOR = {"IPV4": ETH_P_IP, "IPV6": ETH_P_IPV6}


class Config(NamedTuple):
    points: list[str]
    linktype: str | None = None
    snaplen: int = SNAPLEN
    filter: str | None = None
    buffer_kib: int = 0      # -B, all CPUs together (0: fcap.defaults.buffer_kib for this machine's CPUs)
    immediate: bool = False
    predicates: list | tuple = ()   # factories: Point -> predicate (see fcap.kernel.predicates)
    record: str = layout.RECORD_PCAP   # the file record header the programs lay out (pcap or pcapng)
    file_ring: bool = False   # pcap records straight into per-CPU file rings where the kernel allows it
    meta: bool = True         # the programs record pid/tid, comm, mark, netns (unused when a pcap file is written)
    dumps: list | tuple = ()   # --dump PATHs (fcap.kernel.dumps): records then go through the perf buffer
    track: bool = False       # --track (fcap.kernel.track): follow what the filter chose to every point until freed
    track_max: int = TRACK_MAX
    stack: bool = False       # --stack (fcap.kernel.kstack): each record's kernel stack (records: the perf buffer)
    context: bool = False     # --context: the programs record each packet's cgroup; user space names it (comment)
    nft: bool = False         # --nft: the nftables rule of each netfilter drop (fcap.host.nftrace, user space)
    comment: bool = True      # pcapng records carry the metadata comment (--no-comment: they do not)


class Stats:
    """A capture's counts so far."""

    __slots__ = ("captured", "seen", "lost")

    def __init__(self) -> None:
        self.captured = 0      # records handed on (to Session.run's on_record, or a Sink)
        self.seen = 0          # packets the programs tried to record (after predicates and filter)
        self.lost = 0          # records the kernel could not put in a full buffer


def default_linktype(points: list[Point]) -> LinkType:
    """EN10MB where every point is at the device layer (a MAC header is in place); LINUX_SLL2 elsewhere,
    which decodes for any protocol and carries the interface and direction."""
    if all(p.device_layer for p in points):
        return lookup("EN10MB")
    return lookup("LINUX_SLL2")


class Session(Attach):
    """One capture. Use: s = Session(cfg); s.open(); s.attach(); s.run(on_record, stop); s.close()."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.points: list[Point] = []
        self.linktype: LinkType | None = None
        self.cbpf: list | None = None
        self.programs: list[Program] = []
        self.units: list[multi.Unit] = []   # the points by program: one each, or a multi-attach group
        self.loaded: list[tuple[multi.Unit, Program]] = []   # each unit's program, in the order loaded
        self.links: list[Link] = []
        self.maps: list = []
        self.buffer: PerfBuffer | None = None
        self.stats = Stats()
        self.clock_offset_ns = 0
        self.counters: PerCPUArrayMap | None = None   # per point: seen, lost
        self.ring = None          # the file rings' map when the programs write pcap records there
        self.ring_size = 0
        self.drain = None
        self.dump_area = None     # fcap.kernel.dumps.Area when --dump PATHs are copied into the records
        self.parse = layout.parse_record   # a perf sample -> Record
        self.skipped: list[tuple[str, str]] = []   # (point, why) of glob matches the kernel refused
        self.unattached: set[int] = set()   # ids of loaded points the kernel would not attach (their IDBs stay)
        self.point_stats: list = []    # fcap.kernel.stats.PointStats per point, read at the end
        self.attached_ns = self.detached_ns = 0   # wall clock
        self.counts_hits = False       # the programs count hits (else hits == seen)
        self.track_map = self.track_counters = None   # --track
        self.helpers: list[tuple[Point, Program]] = []   # --track: programs that only forget freed skbs
        self.track_report: dict = {}
        self.stacks = None       # --stack: fcap.kernel.kstack.Stacks (the stack map, each id's frames)
        self.window = Window()   # the time order's window, every drain's (fcap.live.order); .late: records written late
        self.nft = None          # --nft: fcap.host.nftrace.Tracer (its trace table), from open() to close()

    # -- set-up --------------------------------------------------------------------------------
    def resolve(self) -> None:
        if not os.path.exists("/sys/kernel/btf/vmlinux"):
            raise CaptureError("this kernel has no BTF (/sys/kernel/btf/vmlinux): fcap needs CONFIG_DEBUG_INFO_BTF")
        check_snaplen(self.cfg.snaplen)
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
        if self.cfg.dumps:
            from fcap.kernel.dumps import make_area
            self.dump_area = make_area(self.points, self.cfg.dumps)
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
        return cprog.ProgramOptions(start=START_FOR[self.linktype.name], snaplen=self.cfg.snaplen, filter=self.cbpf,
                             dynptr_kfunc=pointcaps.dynptr_kfunc(point) if self.cbpf is not None else 0,
                             predicates=preds, record=self.cfg.record, clock_offset_ns=self.clock_offset_ns,
                             meta=self.cfg.meta, task_btf=self.cfg.meta and pointcaps.task_btf(point),
                             dumps=self.dump_area.for_point(point) if self.dump_area is not None else None,
                             head_loads=pointcaps.head_loads(point), count_seen=self.counts_ring_records(),
                             ident=self.ident(), points=len(self.points), stack=self.cfg.stack,
                             starts_inside_free=track.only_inside_free(self.points),
                             context=self.cfg.context, comment=self.cfg.comment,
                             division_tracked=self.cbpf is not None and features.division_ranges() is None)

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

    def open(self) -> None:
        """Resolve, compile, create maps, load every program (nothing attached yet)."""
        if not self.points:
            self.resolve()
        err = features.bpf_syscall()
        if err is not None:
            raise CaptureError(f"cannot use BPF: {err.reason}")
        # sampled once: the programs add it to their record headers' timestamps, user space to the others
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()
        try:
            events = PerfEventArrayMap(possible_cpus(), name="fcap_events")
            self.maps.append(events)
            self._skip_unbuildable()
            self.units = self.plan()
            size = max(cprog.scratch_size(p, self.options(p)) for p in self._program_points())
            scratch = PerCPUArrayMap(size, len(self.points), name="fcap_scratch")
            counters = PerCPUArrayMap(8 * layout.COUNTERS, len(self.points), name="fcap_counters")
            self.maps += [scratch, counters]
            self.counters = counters
            maps = cprog.Maps(events.fileno(), scratch.fileno(), counters.fileno(), size)
            if self.ident() != track.IDENT_NONE:
                self._make_track_maps(maps)
            if self.cfg.stack:
                from fcap.kernel.kstack import Stacks
                self.stacks = Stacks.create(self.maps)
                maps.stack = self.stacks.map.fileno()
                self.parse = self.stacks.parser(self.parse, self.dump_area.size if self.dump_area is not None else 0)
            cpus = online_cpus()
            pages = self._pages(len(cpus))
            kfunc = self._file_ring_kfunc()
            if kfunc:
                if len(cpus) > 1:   # the drain's merge at C speed, imported while the programs load
                    from fcap.live.drain import FAST
                    FAST.load()
                ring_size = self._make_ring(pages * PAGE)
                maps.ring, maps.ring_size, maps.dynptr_kfunc = self.ring.fileno(), ring_size, kfunc
            self._load_all(maps)
            if track.uses_map(self.ident()):
                self._load_helpers(maps)
            if self.ring is not None:   # the perf buffer only carries doorbells: wake at each
                self.buffer = PerfBuffer(events, pages=2, wakeup_bytes=0, cpus=cpus)
                self.ring_size = maps.ring_size
            else:
                wake = 1 if self.cfg.immediate else pages * PAGE // 4
                self.buffer = PerfBuffer(events, pages=pages, wakeup_bytes=wake, cpus=cpus)
            if self.cfg.nft:   # (its trace table before the programs attach: every drop recorded is traced)
                from fcap.host.nftrace import Tracer
                self.nft = Tracer()
        except BPFError as e:
            self.close()
            raise CaptureError(f"{e}") from None
        except CaptureError:
            self.close()
            raise

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

    def plan(self) -> list[multi.Unit]:
        """The points by program (fcap.live.multi): many functions of one kind share a program and a link where the
        kernel has a multi-attach link for them and the program does per point only what the attach cookie says."""
        # --stack keeps a program per point too: its frames to skip are known per single kind (fcap.kernel.kstack)
        per_point_args = self.dump_area is not None or self.cfg.stack or any(getattr(m, "reads_args", False)
                                                                             for m in self.cfg.predicates)
        by_direction = ancillary.reads_direction(self.cbpf) or any(getattr(m, "by_direction", False)
                                                                   for m in self.cfg.predicates)
        return multi.plan(self.points, allowed=not per_point_args, by_direction=by_direction)

    def _program_points(self) -> list[Point]:
        """The points the programs are built for: each unit's point, or a group's stand-in."""
        return [u.points[0] if u.kind is None else multi.stand_in(u.kind, u.points) for u in self.units]

    def _make_track_maps(self, maps: cprog.Maps) -> None:
        from bpf.maps import HashMap
        self.track_counters = PerCPUArrayMap(layout.TRACK_COUNTERS.size, 1, name="fcap_trackcnt")
        self.maps.append(self.track_counters)
        maps.track_counters = self.track_counters.fileno()
        if track.uses_map(self.ident()):
            self.track_map = HashMap(8, layout.TRACK.size, self.cfg.track_max, name="fcap_track", lru=True)
            self.maps.append(self.track_map)
            maps.track = self.track_map.fileno()

    def _load_helpers(self, maps: cprog.Maps) -> None:
        for p, items in self._helper_programs(maps):
            self.helpers.append((p, self._load(p, items)))

    def _helper_programs(self, maps: cprog.Maps):
        """The identity map's helpers (fcap.kernel.track): programs where the kernel frees that end its entries."""
        opts = cprog.ProgramOptions(start=cprog.START_DATA, snaplen=0, ident=self.ident())
        return track.helpers(self.points, len(self.points), lambda p: cprog.Builder(p, opts, maps))

    def _make_ring(self, want: int) -> int:
        """The file rings' map, each CPU's ring `want` bytes or, where the kernel caps a map value (4 MiB before
        some kernels), the largest power of two it takes; returns the ring size."""
        from fcap.kernel.ringrec import element_size
        size = min(want, layout.RING_MAX)
        while True:
            try:
                self.ring = ArrayMap(element_size(size), possible_cpus(),
                                     name="fcap_ring", flags=MapFlags.MMAPABLE)
                self.maps.append(self.ring)
                return size
            except BPFError as e:
                if e.errno not in (errno.E2BIG, errno.ENOMEM) or size <= 1 << 16:
                    raise
                size //= 2

    def _pages(self, ncpus: int) -> int:
        """Pages per CPU (a power of two) for -B KiB shared by the CPUs (its default: fcap.defaults.buffer_kib)."""
        kib = self.cfg.buffer_kib or buffer_kib(ncpus)
        per_cpu = max(kib * 1024 // max(ncpus, 1) // PAGE, 8)
        return 1 << (per_cpu.bit_length() - 1)

    def _file_ring_kfunc(self) -> int:
        """bpf_dynptr_from_skb's BTF id when the records can go to file rings (asked for, every point BTF-typed,
        skb dynptrs allowed there), else 0."""
        if not (self.cfg.file_ring and not self.cfg.immediate) or self.dump_area is not None or self.cfg.stack:
            return 0
        if not all(p.typed for p in self.points) or any(u.kind is not None for u in self.units):
            return 0
        if any(is_drop_point(p) for p in self.points):   # their comments name reason and location: user space's
            return 0
        if self.cfg.context:   # the comment names the cgroup, container and netns: user space's
            return 0
        ids = {pointcaps.dynptr_kfunc(p) for p in self.points}
        return ids.pop() if len(ids) == 1 and 0 not in ids else 0

    @property
    def per_record(self) -> bool:
        """Whether user space lays out each record's block (run(), not run_file()): --dump (its dumps), --stack (its
        stack, read after the record), --nft (the rule that dropped its packet, matched by its bytes)."""
        return self.dump_area is not None or self.stacks is not None or self.nft is not None

    def file_drain(self, writer, options=None, limit: int = 0):
        """What run_file() drains with: the file rings when the programs write there, else the perf buffer."""
        from fcap.live.drain import FileDrain, RingDrain
        if self.ring is not None:
            self.drain = RingDrain(self.ring, self.ring_size, self.buffer, writer, limit=limit, window=self.window)
            return self.drain
        return FileDrain(self.buffer, writer, options=options, limit=limit, window=self.window)

    # -- running -------------------------------------------------------------------------------
    def run(self, on_record: Callable[[layout.Record], bool], stop: Callable[[], bool], poll_ms: int = POLL_MS,
            limit: int = 0) -> None:
        """Drain records into on_record, in time order (fcap.live.order), until stop() is true, on_record returns
        False or `limit` (-c, > 0) is within reach; then detach and drain the rest (up to `limit`)."""
        keep_going = True
        pending = Pending(self.window)
        delivered = 0

        def deliver(final: bool = False) -> None:
            nonlocal keep_going, delivered
            for rec in self.ordered(pending, final, limit - delivered if limit else 0):
                if not keep_going:
                    break
                self.stats.captured += 1
                delivered += 1
                if on_record(rec) is False:
                    keep_going = False

        timeout = POLL_MS_IMMEDIATE if self.cfg.immediate else poll_ms
        while keep_going and not pending.reached and not stop():
            self.wait(pending, timeout)
            deliver()
        self.detach()
        if keep_going:
            deliver(final=True)

    def wait(self, pending: Pending, timeout_ms: int) -> None:
        """Until the buffer has records or the time passes; sooner while `pending` holds records (fcap.live.order)."""
        self.buffer.poll(min(timeout_ms, pending.window.retry_ms) if pending.held else timeout_ms)

    def ordered(self, pending: Pending, final: bool = False, left: int = 0) -> list:
        """The records surely published so far, with those `pending` held, in time order (fcap.live.order); the newest
        stay in `pending` (none when `final`: the programs are detached). `left` (> 0): -c's records to go."""
        cutoff = pending.window.cutoff(final)
        batch: list = []
        parse = self.parse
        self.buffer.drain(lambda cpu, raw: batch.append(parse(raw)))
        return pending.take(batch, cutoff, left)

    def run_file(self, drain: Callable[..., int], stop: Callable[[], bool], poll_ms: int = POLL_MS) -> None:
        """Like run(), for a drain that writes records itself (fcap.live.drain): until stop() is true, the drain is
        done or -c is within its reach; then detach and drain the rest. While the drain holds records
        (fcap.live.order) it is called again at once (a ring a quarter full whose doorbell stays quiet: see
        fcap.live.drain.RingDrain)."""
        buf = self.buffer
        timeout = POLL_MS_IMMEDIATE if self.cfg.immediate else poll_ms
        while not drain.done and not drain.reached and not stop():
            buf.poll(0 if drain.held else timeout)
            self.stats.captured += drain()
        self.detach()
        if not drain.done:
            self.stats.captured += drain(final=True)

    def read_counters(self) -> Stats:
        if self.counters is not None and not self.counters.fd.closed:
            per_point = stats.read(self.counters, self.points, self.counts_hits)
            self.stats.seen = sum(s.seen for s in per_point)
            self.stats.lost = sum(s.lost for s in per_point)
            ring_total = self.ring is not None and not self.counts_ring_records()
            if ring_total:   # file rings: the programs count failures only; a ring counts its records
                from fcap.live.drain import ring_records
                self.stats.seen += self.drain.published() if self.drain is not None else ring_records(self.ring)
            if self.buffer is not None and self.ring is None:   # (with file rings: only doorbells there)
                self.stats.lost = max(self.stats.lost, self.buffer.lost)
            self.point_stats = stats.with_seen(per_point, self.stats.seen, self.counts_hits) if ring_total else \
                per_point
        if self.cfg.track and self.track_map is not None and not self.track_map.fd.closed:
            remaining = sum(1 for _ in self.track_map.keys())
            self.track_report = dict(track.read_counters(self.track_counters),
                                     evicted=track.evicted(self.track_counters, remaining), size=self.cfg.track_max)
        return self.stats

    def close(self) -> None:
        self.detach()
        self.read_counters()
        if self.nft is not None:   # (its counts stay readable)
            self.nft.close()
        if self.drain is not None:
            self.drain.close()
            self.drain = None
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None
        ids = []
        self.programs += [prog for _p, prog in self.helpers]
        self.helpers = []
        for prog in self.programs:
            try:
                ids.append(prog.info().id)
            except (BPFError, ValueError):
                pass
            prog.close()
        self.programs = []
        for m in self.maps:
            m.close()
        self.maps = []
        if ids:   # return when the kernel has let go of them (a link's release may put its program after an RCU
            wait_freed(ids, 1.0)   # grace period), so that nothing of ours shows in bpftool once we are gone

    def dump(self) -> str:
        """The generated programs, disassembled (for --dump-ebpf)."""
        from bpf import asm
        self.units = self.units or self.plan()
        size = max(cprog.scratch_size(p, self.options(p)) for p in self._program_points())
        maps = cprog.Maps(events=-1, scratch=-2, counters=-3, scratch_size=size)
        if self.ident() != track.IDENT_NONE:
            maps.track, maps.track_counters = -5, -6
        if self.cfg.stack:
            maps.stack = -7
        kfunc = self._file_ring_kfunc()
        if kfunc:   # what open() would load: the programs that write the file rings (map fd -4)
            maps.ring, maps.ring_size = -4, min(self._pages(len(online_cpus())) * PAGE, layout.RING_MAX)
            maps.dynptr_kfunc = kfunc
        out = []
        for unit, p in zip(self.units, self._program_points()):
            if unit.kind is None:
                out.append(f"; {p.spec}: {p.prototype()}  (skb: argument {p.skb_index})")
            else:
                out.append(f"; {unit.kind}: {len(unit.points)} functions ({unit.points[0].name}, ...) in one link, "
                           f"the attach cookie the point id and its bits (skb: argument {p.skb_index})")
            out.append(asm.disassemble(self.build(p, maps)))
        if track.uses_map(self.ident()):
            for p, items in self._helper_programs(maps):
                out.append(f"; {p.spec}: the identity map forgets what is freed here (nothing captured)")
                out.append(asm.disassemble(items))
        return "\n".join(out)


def protocol_predicate(ethertype: int) -> Callable:
    """Keep only packets whose skb->protocol is `ethertype` (for the IPV4/IPV6 linktypes); where the kernel has not
    set it yet, the IP version says."""
    from bpf.asm import JNE, R8, H, jmp

    def emit(b: cprog.Builder) -> list:
        b.read(H, R8, cprog.R6, b.offsets.protocol)
        b.protocol_from_version("_pred")
        return [jmp(JNE, R8, loaded16(ethertype), "out")]
    return emit
