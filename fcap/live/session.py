"""A capture session: its plan (fcap.live.planner) made into maps and loaded programs, attached, its buffers drained,
counted, detached."""

from __future__ import annotations

import errno
import time
from typing import Callable

from bpf import probes
from bpf.errors import BPFError
from bpf.link import Link
from bpf.maps import ArrayMap, HashMap, PerCPUArrayMap, PerfEventArrayMap, possible_cpus
from bpf.perfbuf import PAGE, PerfBuffer
from bpf.prog import Program, wait_freed
from bpf.uapi import MapFlags

from fcap.defaults import CTX_ENTRIES, DROP_TEXTS, DUMP_TEXTS, NFT_TEXTS, POLL_MS, POLL_MS_IMMEDIATE
from fcap.errors import CaptureError
from fcap.kernel import layout, stats, track
from fcap.kernel import program as cprog
from fcap.live import multi
from fcap.live.attach import Attach
from fcap.live.order import Pending, Window
from fcap.live.planner import Config, Planner
from fcap.points.spec import Point


class Stats:
    """A capture's counts so far."""

    __slots__ = ("captured", "seen", "lost")

    def __init__(self) -> None:
        self.captured = 0      # records handed on (to Session.run's on_record, or a Sink)
        self.seen = 0          # packets the programs tried to record (after predicates and filter)
        self.lost = 0          # records the kernel could not put in a full buffer


class Session(Planner, Attach):
    """One capture. Use: s = Session(cfg); s.open(); s.attach(); s.run(on_record, stop); s.close()."""

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.programs: list[Program] = []
        self.loaded: list[tuple[multi.Group, Program]] = []   # each group's program, in the order loaded
        self.links: list[Link] = []
        self.maps: list = []
        self.buffer: PerfBuffer | None = None
        self.frags: PerfBuffer | None = None   # file rings' side: packets with bytes in frags (no skb dynptrs),
                                               # --context's not named yet (fcap.kernel.ringrec)
        self.stats = Stats()
        self.counters: PerCPUArrayMap | None = None   # per point: seen, lost
        self.ring = None          # the file rings' map when the programs write pcap records there
        self.ring_size = 0
        self.drain = None
        self.unattached: set[int] = set()   # ids of loaded points the kernel would not attach (their IDBs stay)
        self.point_stats: list = []    # fcap.kernel.stats.PointStats per point, read at the end
        self.attached_ns = self.detached_ns = 0   # wall clock
        self.track_map = self.track_counters = None   # --track
        self.helpers: list[tuple[Point, Program]] = []   # --track: programs that only forget freed skbs
        self.track_report: dict = {}
        self.follows_copies = False   # --track: the copy functions' helpers are loaded (fcap.kernel.track)
        self.stacks = None       # --stack: fcap.kernel.kstack.Stacks (the stack map, each id's frames)
        self.ctx_names = None    # --context into the file rings: the names' map (fcap.features.packet_context)
        self.stack_texts = None  # --stack into the file rings: the frames' map (fcap.kernel.kstack.Stacks fills it)
        self.drop_texts = None   # drop points into the file rings: the names' map (fcap.features.drop_reason's)
        self.dump_options = None   # --dump into the file rings: what gives their options (fcap.kernel.dumps)
        self.window = Window()   # the time order's window, every drain's (fcap.live.order); .late: records written late
        self.nft = None          # --nft: fcap.kernel.nftfilter.Rules (its maps, trace tables, names), open() to close()

    # -- set-up --------------------------------------------------------------------------------

    def open(self) -> None:
        """Resolve, compile, create maps, load every program (nothing attached yet)."""
        if not self.points:
            self.resolve()
        err = probes.bpf_syscall()
        if err is not None:
            raise CaptureError(f"cannot use BPF: {err.reason}")
        # sampled once: the programs add it to their record headers' timestamps, user space to the others
        self.clock_offset_ns = time.time_ns() - time.monotonic_ns()
        try:
            events = PerfEventArrayMap(possible_cpus(), name="fcap_events")
            self.maps.append(events)
            self._skip_unbuildable()
            plan = self.map_plan()
            scratch = PerCPUArrayMap(plan.scratch_size, len(self.points), name="fcap_scratch")
            counters = PerCPUArrayMap(8 * layout.COUNTERS, len(self.points), name="fcap_counters")
            self.maps += [scratch, counters]
            self.counters = counters
            maps = cprog.Maps(events.fileno(), scratch.fileno(), counters.fileno(), plan.scratch_size)
            self._make_feature_maps(plan, maps)
            if self.cfg.file and (len(plan.cpus) > 1 or not plan.kfunc):
                from fcap.live.drain import FAST   # the drain's merge (the perf buffer's walk) at C speed, imported
                FAST.load()                         # while the programs load
            frags = self._make_rings(plan, maps) if plan.ring_size else None
            self._load_all(maps)
            if self.stacks is not None:
                self.stacks.symbols.load()   # (now, not at the first record: see fcap.host.kallsyms)
            if track.uses_map(self.ident()):
                self._load_helpers(maps)
            self._make_buffer(events, plan, maps.ring_size)
            if frags is not None:   # (its wake-ups wake the loop's poll of the doorbells; with names to give, at
                wake = PAGE if plan.gives else plan.pages * PAGE // 4   # a page: the packets after a key's first
                self.frags = PerfBuffer(frags, pages=plan.pages, wakeup_bytes=wake, cpus=plan.cpus)   # are named soon)
                self.buffer.watch(self.frags.fileno())
            if self.nft is not None:   # (its trace tables before the programs attach: every drop recorded is traced)
                self.nft.trace()
        except BPFError as e:
            self.close()
            raise CaptureError(f"{e}") from None
        except CaptureError:
            self.close()
            raise

    def _make_buffer(self, events, plan, ring_size: int) -> None:
        """The perf buffer: the records' own (-B's pages per CPU, woken at a quarter full or, --immediate-mode, at
        each record), or where the file rings hold the records their doorbells (woken at each)."""
        if self.ring is not None:
            self.buffer = PerfBuffer(events, pages=2, wakeup_bytes=0, cpus=plan.cpus)
            self.ring_size = ring_size
        else:
            wake = 1 if self.cfg.immediate else plan.pages * PAGE // 4
            self.buffer = PerfBuffer(events, pages=plan.pages, wakeup_bytes=wake, cpus=plan.cpus)

    def _make_track_maps(self, maps: cprog.Maps) -> None:
        self.track_counters = PerCPUArrayMap(layout.TRACK_COUNTERS.size, 1, name="fcap_trackcnt")
        self.maps.append(self.track_counters)
        maps.track_counters = self.track_counters.fileno()
        if track.uses_map(self.ident()):
            self.track_map = HashMap(8, layout.TRACK.size, self.cfg.track_max, name="fcap_track", lru=True)
            self.maps.append(self.track_map)
            maps.track = self.track_map.fileno()

    def _make_feature_maps(self, plan, maps: cprog.Maps) -> None:
        """The maps of --track, --stack and --nft, where asked for."""
        if plan.track:
            self._make_track_maps(maps)
        if plan.stack:
            from fcap.kernel.kstack import Stacks
            self.stacks = Stacks.create(self.maps)
            maps.stack = self.stacks.map.fileno()
            self.parse = self.stacks.parser(self.parse, self.lead)
        if plan.nft:
            self._make_nft_maps(maps)

    def _make_nft_maps(self, maps: cprog.Maps) -> None:
        """--nft's maps: what the trace socket's program leaves on each CPU, and the rules' texts."""
        from fcap.features.nft_rule import rule_text
        from fcap.kernel.nftfilter import Rules
        slots = PerCPUArrayMap(layout.NFT_SLOT.size, 1, name="fcap_nftslot")
        self.maps.append(slots)
        texts = self._texts_map(layout.NFT_TEXT_KEY, layout.NFT_TEXT, NFT_TEXTS, "fcap_nfttext")
        self.nft = Rules(slots, texts, rule_text, self.cfg.nft_netns)
        maps.nftslot, maps.nfttext = slots.fileno(), texts.fileno()

    def _load_helpers(self, maps: cprog.Maps) -> None:
        for p, items in self._helper_programs(maps):
            self.helpers.append((p, self._load(p, items)))
        self.follows_copies = any(p.name in track.COPY_NAMES for p, _prog in self.helpers)


    def _make_rings(self, plan, maps: cprog.Maps):
        """The file rings, and the perf event array of the records they cannot take (returned; None where they take
        every one): where the kernel has no skb dynptrs, the packets with bytes in frags; with texts user space gives
        the programs in the comments (plan.gives: --context's names, --stack's frames, a drop's names), those whose
        text it has not given yet (a map each)."""
        ring_size = self._make_ring(plan.ring_size)
        maps.ring, maps.ring_size, maps.dynptr_kfunc = self.ring.fileno(), ring_size, plan.kfunc
        if plan.context:
            self.ctx_names = self._texts_map(layout.CTX_KEY, layout.CTX_TEXT, CTX_ENTRIES, "fcap_ctxtext")
            maps.ctxtext = self.ctx_names.fileno()
        if plan.stack_texts:
            from fcap.features.kernel_stack import comment_text
            from fcap.kernel.kstack import STACK_MAX
            self.stack_texts = self._texts_map(layout.STK_KEY, layout.STK_TEXT, STACK_MAX + 1, "fcap_stktext")
            maps.stktext = self.stack_texts.fileno()
            self.stacks.give_to(self.stack_texts, comment_text)
        if plan.drop_texts:
            self.drop_texts = self._texts_map(layout.DROP_TEXT_KEY, layout.DROP_TEXT, DROP_TEXTS, "fcap_droptext")
            maps.droptext = self.drop_texts.fileno()
        if plan.dump_texts:
            from fcap.kernel.dumps import GivenOptions
            texts = self._texts_map(layout.DUMP_TEXT_KEY, layout.DUMP_TEXT, DUMP_TEXTS, "fcap_dumptext")
            maps.dumptext = texts.fileno()
            self.dump_options = GivenOptions(texts, DUMP_TEXTS)
        if plan.kfunc and not plan.gives:
            return None
        frags = PerfEventArrayMap(possible_cpus(), name="fcap_frags")
        self.maps.append(frags)
        maps.frags = frags.fileno()
        return frags

    def _texts_map(self, key, value, entries: int, name: str) -> HashMap:
        """A map of texts user space gives the programs (fcap.kernel.ringrec), no value preallocated: a value a
        program holds is never reused."""
        texts = HashMap(key.size, value.size, entries, name=name, flags=MapFlags.NO_PREALLOC)
        self.maps.append(texts)
        return texts

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

    def file_drain(self, writer, options=None, limit: int = 0):
        """What run_file() drains with: the file rings when the programs write there, else the perf buffer."""
        from fcap.live.drain import FileDrain
        from fcap.live.ringdrain import RingDrain
        refresh = self._names_refresh()
        if self.ring is not None:
            side = None if self.frags is None else FileDrain(self.frags, writer, options=options, window=self.window,
                                                             parse=self.parse, lead=self.lead, refresh_ns=refresh)
            self.drain = RingDrain(self.ring, self.ring_size, self.buffer, writer, limit=limit, window=self.window,
                                   side=side)
            return self.drain
        return FileDrain(self.buffer, writer, options=options, limit=limit, window=self.window, parse=self.parse,
                         lead=self.lead, refresh_ns=refresh)

    def _names_refresh(self) -> int:
        """How long a file drain keeps a block's options before --context's names are made again (0: for good): half
        the time the programs keep the names given them (fcap.features.packet_context)."""
        if not self.cfg.context:
            return 0
        from fcap.host.ctxnames import REFRESH_NS
        return REFRESH_NS // 2

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
        fcap.live.ringdrain.RingDrain)."""
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
                from fcap.live.ringdrain import ring_records
                self.stats.seen += self.drain.published() if self.drain is not None else ring_records(self.ring)
            if self.buffer is not None and self.ring is None:   # (with file rings: only doorbells there)
                self.stats.lost = max(self.stats.lost, self.buffer.lost)
            self.point_stats = stats.with_seen(per_point, self.stats.seen, self.counts_hits) if ring_total else \
                per_point
        if self.cfg.track and self.track_map is not None and not self.track_map.fd.closed:
            remaining = sum(1 for _ in self.track_map.keys())
            self.track_report = dict(track.read_counters(self.track_counters),
                                     evicted=track.evicted(self.track_counters, remaining), size=self.cfg.track_max,
                                     copies=self.follows_copies)
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
        if self.frags is not None:
            self.frags.close()
            self.frags = None
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

