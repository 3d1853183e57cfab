"""The capture program for a point: prologue (skb from the context), metadata, header bytes, filter, copy, record."""

from __future__ import annotations

from types import SimpleNamespace


from bpf import asm
from bpf.asm import (
    BYTES_SIZE, ADD, DW, FP, JEQ, JGE, JGT, JNE, OR, R0, R1, R2, R3, R6, R7, R8, R9, SUB, B, H, W, addi,
    alu64, andi, call, exit_, jmp, label, ld_imm64, ld_map_fd, ldx, lshi, mov, movi, rshi, st, stx)
from bpf.btf import BTFError
from bpf.uapi import Helper

from fcap.errors import ProgramError
from fcap.files.linktypes import ETH_P_IP, ETH_P_IPV6, PACKET_OUTGOING, loaded16
from fcap.kernel import (ancillary, context, drops, dumps, epbopts, kstack, linkhdr, nftverdict, perfrec, pointinfo,
                         predicates, ringrec, stats, track, verdicts)
from fcap.kernel.parts import (BEFORE_COPY, BEFORE_FILTER, DEVICE, END, ENTRY, FILTER, HEADERS, KEPT, RECORD_META,
                                 SELECT, SELECTED, WRITE, Part, active)
from fcap.kernel.filter import PACKET_FILTER
from fcap.kernel.layout import (COPY_MAX, HDR_MAX, META, RING_COPY_MAX, START_DATA, START_MAC, START_NETWORK,
                                START_SLL2, STACK)
from fcap.kernel.progopts import KernelOffsets, Maps, ProgramOptions, dump_area, scratch_size
from fcap.kernel.snapshot import Snapshot
from fcap.points.spec import Point

__all__ = ["START_DATA", "START_MAC", "START_NETWORK", "START_SLL2", "PARTS", "Builder", "Maps", "ProgramOptions",
           "build", "scratch_size"]


class Builder:
    """Generates the instructions for one point. Registers: R6 skb, R7 scratch, R8/R9 values kept across calls."""

    def __init__(self, point: Point, opts: ProgramOptions, maps: Maps):
        self.copies_bytes = point.copies_bytes   # (else bpf_skb_output reads the skb)
        self.point = point                       # where the program runs (kind, skb argument, id, BTF)
        self.options = opts                      # what the capture asks of it (ProgramOptions)
        self.maps = maps                         # the fds of the maps it uses (Maps)
        self.offsets = KernelOffsets(point.btf)  # where the kernel structures it reads hold their members
        self.snap = None if point.typed else Snapshot()   # untyped: the skb's members from one copy of them
        self.items: list = []
        self._labels = 0
        self._shared: dict[str, SimpleNamespace] = {}

    def fresh(self, prefix: str) -> str:
        """A label name not used before in this program."""
        self._labels += 1
        return f"{prefix}_{self._labels}"

    def fresh_names(self, prefix: str, *names: str) -> SimpleNamespace:
        """fresh() labels for the names one part's code jumps to across its functions, as attributes."""
        return SimpleNamespace(**{n: self.fresh(f"{prefix}_{n}") for n in names})

    def shared_names(self, prefix: str, *names: str) -> SimpleNamespace:
        """fresh_names() made once per program: the labels one part's code at several stages jumps across."""
        if prefix not in self._shared:
            self._shared[prefix] = self.fresh_names(prefix, *names)
        return self._shared[prefix]

    def emit(self, *items) -> None:
        for it in items:
            if isinstance(it, list):
                self.items.extend(it)
            else:
                self.items.append(it)

    def point_id(self, dst: int) -> list:
        """dst = this point's id: a constant, or (a multi-attach program) the attach cookie the prologue kept."""
        if self.point.kind.multi:
            return [ldx(W, dst, FP, STACK.key)]
        return [movi(dst, self.point.id)]

    def store_point_id(self, base: int, field: str, tmp: int, at: int = 0) -> list:
        """META's `field` (at `at` past `base`) = this point's id; a multi-attach program's goes through `tmp`."""
        if self.point.kind.multi:
            return [ldx(W, tmp, FP, STACK.key), META.store(base, field, tmp, at)]
        return [META.store_imm(base, field, self.point.id, at)]

    # -- reading kernel memory: direct loads where the verifier knows the types, probe_read elsewhere
    def read(self, size: int, dst: int, base: int, off: int) -> None:
        """dst = *(size *)(base + off); dst must not be R1-R5 when the point is untyped (except for the skb's
        members, R6 + off: from the program's copy of them, fcap.kernel.snapshot)."""
        if self.point.typed:
            self.emit(ldx(size, dst, base, off))
            return
        if base == R6 and self.snap.covers(size, off):
            self.emit(self.snap.load(size, dst, R7, off))
            return
        nbytes = asm.SIZE_BYTES[size]
        self.emit(mov(R1, FP), addi(R1, STACK.tmp), movi(R2, nbytes), mov(R3, base), addi(R3, off),
                  st(DW, FP, STACK.tmp, 0) if nbytes < 8 else [],
                  call(Helper.probe_read_kernel), ldx(size, dst, FP, STACK.tmp))

    def skb_head(self, dst: int) -> list:
        """dst = skb->head in a typed program: a pointer to untrusted memory, where the verifier lets loads through it
        (head_loads: 6.17+ types it PTR_TO_MEM | MEM_RDONLY | PTR_UNTRUSTED, each load guarded by the JIT)."""
        return [ldx(DW, dst, R6, self.offsets.head), asm.holds(dst, "mem_untrusted")]

    def device(self, dst: int) -> None:
        """dst = the packet's device (struct net_device *, 0: none)."""
        self.read(DW, dst, R6, self.offsets.dev)

    def skb_mark(self, dst: int) -> None:
        self.read(W, dst, R6, self.offsets.mark)

    def nonlinear_len(self, dst: int) -> None:
        """dst = the bytes of the packet not in its linear part (skb->data_len); dst not R1-R5 when untyped."""
        self.read(W, dst, R6, self.offsets.data_len)

    def build(self) -> list:
        """The skeleton, with the parts on for this program put in at their stages (fcap.kernel.parts)."""
        self.parts = active(PARTS, self.point, self.options, self.maps)
        self.clock_first = not any(f.turns_away for f in self.parts)
        self.prologue()
        for stage in (ENTRY, SELECT, SELECTED):
            self.stage(stage)
            if stage == SELECT and self.snap is not None:   # (the copy goes here when nothing before reads it)
                self.snap.mark(self.items)
        self.metadata()
        self.headers()
        self.stage(HEADERS)
        for stage in (BEFORE_FILTER, FILTER, KEPT):
            self.stage(stage)
        self.late_metadata()   # what only the record needs: after the filter, so a rejected packet costs less
        self.stage(BEFORE_COPY)
        self.copy_length()
        self.stage(WRITE)
        self.stage(END)
        self.emit(label("out"), movi(R0, 0), exit_())
        if self.snap is not None:
            self.snap.place(self.items, R7, R6)
        return self.items

    def stage(self, stage: str) -> None:
        """What the program's parts emit at `stage`, in their declared order."""
        for part in self.parts:
            emit = part.emitter(stage)
            if emit is not None:
                emit(self)

    def prologue(self) -> None:
        """The skb pointer from the context (R6; the context saved at STACK.ctx) and this point's scratch value (R7,
        past the dump area); no skb or no value: out."""
        p, o = self.point, self.options
        if not p.kind.multi and not p.kind.has_arg(p.skb_index):
            raise ProgramError(f"{p.spec}: the skb is argument {p.skb_index + 1}, past the registers")
        # each point has its own scratch value and counters (key = point id): a program interrupted on its CPU
        # by another point's (a softirq in the middle of a transmit) must not find its record half overwritten.
        # A multi-attach program runs at many points: the attach cookie's low half is the point id, the high half
        # what the program does differently there, the skb's argument too (fcap.kernel.pointinfo).
        self.emit(stx(DW, FP, STACK.ctx, R1))
        if p.kind.multi:
            self.emit(call(Helper.get_attach_cookie), pointinfo.keep(), pointinfo.skb_arg(R2),
                      ldx(DW, R1, FP, STACK.ctx), p.kind.load_arg_at(R6, STACK.tmp, "out"))
        else:
            self.emit(p.kind.load_arg(R6, p.skb_index, STACK.tmp), st(W, FP, STACK.key, p.id))
        self.emit(jmp(JEQ, R6, 0, "out"))
        # scratch value
        self.emit(ld_map_fd(R1, self.maps.scratch), mov(R2, FP), addi(R2, STACK.key),
                  call(Helper.map_lookup_elem), jmp(JEQ, R0, 0, "out"), mov(R7, R0))
        if dump_area(o):
            self.emit(addi(R7, dump_area(o)))
        if self.clock_first:
            self.clock()
        if self.snap is not None:   # (its range is known once the program is made: build() puts it in)
            self.snap.mark(self.items)

    def clock(self) -> None:
        """META's ts. First thing when every packet is recorded (clock_first), else after what may turn a packet
        away (a reject costs no clock read). bpf_ktime_get_ns reads the TSC with rdtscp, which waits for the
        instructions before it: read first, nothing is waiting yet (pcap at net_dev_queue: ~10 ns a packet less
        than read after the link headers)."""
        self.emit(call(Helper.ktime_get_ns), META.store(R7, "ts", R0))

    def metadata(self) -> None:
        """What the link headers and the filter need: skb, len, protocol, pkt_type, ifindex, ARPHRD type."""
        f = self.offsets
        self.emit(META.store(R7, "skb", R6))
        self.read(W, R8, R6, f.len)
        self.emit(META.store(R7, "len", R8))
        self.read(H, R8, R6, f.protocol)
        if self.options.start in (START_SLL2, START_MAC):   # (their link headers name it)
            self.protocol_from_version()
        self.emit(META.store(R7, "proto", R8))
        self.read(B, R8, R6, f.pkt_type_byte)
        if f.pkt_type_shift:
            self.emit(rshi(R8, f.pkt_type_shift))
        self.emit(andi(R8, f.pkt_type_mask))
        if self.point.kind.multi:   # (the point's direction is in its cookie: fcap.kernel.pointinfo)
            into = self.fresh("not_out")
            self.emit(pointinfo.unless(R0, pointinfo.OUT, into), movi(R8, PACKET_OUTGOING), label(into))
        elif self.point.direction == "out":   # what the point sees, whatever the link type (as AF_PACKET marks it)
            self.emit(movi(R8, PACKET_OUTGOING))
        self.emit(META.store(R7, "pkt_type", R8), self.store_point_id(R7, "point", R0),
                  META.store_imm(R7, "flags", 0), META.store_imm(R7, "ifindex", 0), META.store_imm(R7, "hatype", 0),
                  META.store_imm(R7, "netns", 0))
        # the device: ifindex, ARPHRD type (for LINUX_SLL2 and the records that show them; not for a pcap file of
        # another link type)
        if not (self.options.meta or self.options.start == START_SLL2):
            return
        no_dev = self.fresh("no_dev")
        self.read(DW, R8, R6, f.dev)
        self.emit(jmp(JEQ, R8, 0, no_dev))
        self._read_store(R8, f.ifindex, "ifindex")
        self._read_store(R8, f.hatype, "hatype")
        self.emit(label(no_dev))
        self.stage(DEVICE)   # (only where the device is recorded)

    def late_metadata(self) -> None:
        """What only the record needs: the timestamp, and (unless a pcap file or pcapng records without comments
        are all they feed) pid/tid, comm, mark and the device's network namespace."""
        f = self.offsets
        meta = self.options.meta and self.options.comment
        if not self.clock_first:
            self.clock()
        if meta and self.point.typed and f.task is not None and self.options.task_btf:
            # one helper for the task, then plain loads (cheaper than get_current_pid_tgid + get_current_comm)
            pid, tgid, comm = f.task
            self.emit(call(Helper.get_current_task_btf), ldx(W, R1, R0, tgid), lshi(R1, 32),
                      ldx(W, R2, R0, pid), alu64(OR, R1, R2, reg=True), META.store(R7, "pidtgid", R1),
                      ldx(DW, R1, R0, comm), stx(DW, R7, META.off("comm"), R1),
                      ldx(DW, R1, R0, comm + 8), stx(DW, R7, META.off("comm") + 8, R1))
        elif meta:
            self.emit(call(Helper.get_current_pid_tgid), META.store(R7, "pidtgid", R0),
                      mov(R1, R7), addi(R1, META.off("comm")), movi(R2, 16), call(Helper.get_current_comm))
        self.stage(RECORD_META)
        if meta:
            self.mark_and_netns()

    def mark_and_netns(self) -> None:
        """META's fields copied from the sk_buff (mark, ...: fcap.kernel.record's Field.skb) and the device's network
        namespace."""
        f = self.offsets
        for field, (off, size) in f.copied.items():
            if size > META.width(field):
                raise ProgramError(f"sk_buff's member for META's {field} is wider than it ({size} bytes)")
            self.read(BYTES_SIZE[size], R8, R6, off)
            self.emit(META.store(R7, field, R8))
        if f.net_inum is not None:
            no_netns = self.fresh("no_netns")
            self.read(DW, R8, R6, f.dev)
            self.emit(jmp(JEQ, R8, 0, no_netns))
            self.read(DW, R8, R8, f.dev_net)
            self.emit(jmp(JEQ, R8, 0, no_netns))
            self._read_store(R8, f.net_inum, "netns")
            self.emit(label(no_netns))

    def _read_store(self, base: int, off: int, field: str) -> None:
        """META's `field` = *(base + off), as wide as META declares it."""
        if self.point.typed:
            self.emit(META.load(R0, base, field, off - META.off(field)), META.store(R7, field, R0))
        else:
            self.emit(mov(R1, R7), addi(R1, META.off(field)), movi(R2, META.width(field)), mov(R3, base),
                      addi(R3, off), call(Helper.probe_read_kernel))

    def protocol_from_version(self) -> None:
        """R8 = skb->protocol, or where it is still 0 (before __ip_local_out sets it: fentry/ip_send_skb,
        udp_send_skb, ...) ETH_P_IP or ETH_P_IPV6 from the version nibble at the network header. Clobbers R9."""
        f, known, v6 = self.offsets, self.fresh("proto_known"), self.fresh("proto_v6")
        self.emit(jmp(JNE, R8, 0, known))
        self.read(H, R9, R6, f.network)
        self.emit(jmp(JEQ, R9, 0xFFFF, known))
        self.read(DW, R8, R6, f.head)
        self.emit(mov(R3, R8), alu64(ADD, R3, R9, reg=True), mov(R1, FP), addi(R1, STACK.tmp), movi(R2, 1),
                  call(Helper.probe_read_kernel), movi(R8, 0), jmp(JNE, R0, 0, known),
                  ldx(B, R9, FP, STACK.tmp), rshi(R9, 4),
                  jmp(JNE, R9, 4, v6), movi(R8, loaded16(ETH_P_IP)), asm.ja(known),
                  label(v6), jmp(JNE, R9, 6, known), movi(R8, loaded16(ETH_P_IPV6)),
                  label(known))

    def headers(self) -> None:
        """Where the linktype's bytes start, a made-up link header, the header bytes before skb->data
        (fcap.kernel.linkhdr; XdpBuilder's: from the xdp_buff). Leaves hdr_total in meta and in R8."""
        linkhdr.headers(self)

    def copy_length(self) -> None:
        """R2 = the skb bytes the record takes (from offset 0, skip included), R8 = hdr_total."""
        o = self.options
        # R8 = hdr_total; copy = min(len, skip + max(snaplen - hdr, 0), COPY_MAX (a perf sample, less the --dump
        # area) or RING_COPY_MAX (file rings, which --dump does not use))
        area = dump_area(o)
        cmax = RING_COPY_MAX if self.point.typed and self.maps.ring else COPY_MAX - area
        snap_ok, longer, cap, over, done = (self.fresh(n) for n in ("snap_ok", "copy_len", "copy_cap", "copy_max",
                                                                  "copy_set"))
        self.emit(META.load(R8, R7, "hdr"), jmp(JGT, R8, HDR_MAX, "out"))
        if o.snaplen > HDR_MAX:
            # hdr <= HDR_MAX < snaplen: no compare. (A register-register compare of the constant with R8 makes
            # 6.1's verifier walk the impossible branch with R8's umin > umax; R8 then turns a map_value
            # pointer into a scalar and raw_tp/kprobe programs are rejected.)
            self.emit(ld_imm64(R2, o.snaplen), alu64(SUB, R2, R8, reg=True))
        else:
            self.emit(movi(R2, 0), jmp(JGE, R8, o.snaplen, snap_ok), movi(R2, o.snaplen),
                      alu64(SUB, R2, R8, reg=True), label(snap_ok))
        self.emit(META.load(R3, R7, "skip"), alu64(ADD, R2, R3, reg=True),
                  META.load(R3, R7, "len"), jmp(JGT, R2, R3, longer, reg=True), asm.ja(cap),
                  label(longer), mov(R2, R3), label(cap),
                  jmp(JGT, R2, cmax, over), asm.ja(done), label(over), movi(R2, cmax), label(done))

    def perf_output(self, events: int = 0) -> None:
        """Hand the record to the perf buffer (fcap.kernel.perfrec; XdpBuilder's appends a multi-buffer packet's
        frags): the session's `events` (0: maps.events). In: R2 = copy, R8 = hdr_total."""
        perfrec.perf_output(self, events)

    def ancillary_load(self, field: int, dst: int, reject: str) -> list:
        """A Linux ancillary field the filter loads (inbound/outbound, ...): from the skb saved at STACK.skb."""
        return ancillary.load(self.point, field, dst, reject, STACK.skb, STACK.tmp, self.snap)

# Every part of the capture program, in the order the builder runs each stage's
PARTS: tuple[Part, ...] = (stats.HITS, track.TRACKING, predicates.PREDICATES, drops.DROP_META,
                           nftverdict.NFT_VERDICT, ancillary.VLAN_TAG, PACKET_FILTER, track.PACKET_IDS, epbopts.QUEUE,
                           context.CGROUP, verdicts.VERDICT, kstack.STACKS, dumps.DUMPS, ringrec.FILE_RING,
                           ringrec.COMMENT, ringrec.EPB_OPTIONS, perfrec.PERF_OUTPUT, stats.COUNTS)


def build(point: Point, opts: ProgramOptions, maps: Maps) -> list:
    """The instructions (with labels) of the capture program for `point`."""
    try:
        return Builder(point, opts, maps).build()
    except BTFError as e:   # a kernel's BTF without what the program reads (or a corrupt one)
        raise ProgramError(f"{point.kind}/{point.name}: cannot read the kernel's BTF: {e}") from None
