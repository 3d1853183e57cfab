"""What a capture program is built from: the maps it uses, its options, its scratch size, the kernel's offsets."""

from __future__ import annotations

from typing import NamedTuple

from bpf.btf import BTF, BTFError

from fcap.errors import ProgramError
from fcap.kernel.layout import (CAREA, FILTER_CAP, HDR_MAX, LINEAR_CAP, PKT, RECORD_PCAP, RECORD_PCAPNG, SKB_SNAP,
                                SKB_SNAP_MAX)
from fcap.kernel.record import FIELDS
from fcap.points.spec import Point


class Maps:
    """The maps a capture's programs use (fds), filled in as the session makes them."""

    __slots__ = ("events", "scratch", "counters", "scratch_size", "ring", "ring_size", "dynptr_kfunc", "frags", "track",
                 "track_counters", "stack", "ctxtext", "stktext", "droptext", "nftslot", "nfttext",
                 "dumptext")

    def __init__(self, events: int, scratch: int, counters: int, scratch_size: int = 0):
        self.events = events              # PERF_EVENT_ARRAY fd
        self.scratch = scratch            # PERCPU_ARRAY fd, one value of scratch_size bytes
        self.counters = counters          # PERCPU_ARRAY fd, one value of COUNTERS u64s
        self.scratch_size = scratch_size
        self.ring = 0           # mmapable ARRAY fd of per-CPU file rings (fcap.kernel.ringrec), 0: the perf buffer
        self.ring_size = 0      # RING: bytes of each CPU's ring (a power of two)
        self.dynptr_kfunc = 0   # BTF id of bpf_dynptr_from_skb, for the file ring's copy
        self.frags = 0          # PERF_EVENT_ARRAY fd for file-ring captures' records the rings cannot take: bytes in
                                # frags (no kfunc), texts user space has not given yet (--context's, --stack's,
                                # a drop's)
                                # (fcap.kernel.ringrec)
        self.track = 0          # the identity map (LRU hash, fcap.kernel.track), 0: none
        self.track_counters = 0   # its counters and the packet id counters (PERCPU_ARRAY, one TRACK_COUNTERS value)
        self.stack = 0          # --stack: the STACK_TRACE map (fcap.kernel.kstack), 0: none
        self.ctxtext = 0        # --context into the file rings: the names' HASH map (layout.CTX_KEY -> CTX_TEXT)
        self.stktext = 0        # --stack into the file rings: the frames' HASH map (layout.STK_KEY -> STK_TEXT)
        self.droptext = 0       # drop points into the file rings: their names' (layout.DROP_TEXT_KEY -> DROP_TEXT)
        self.nftslot = 0        # --nft: what the trace socket's program leaves on each CPU (layout.NFT_SLOT)
        self.nfttext = 0        # --nft: each rule key's text (layout.NFT_TEXT_KEY -> NFT_TEXT), user space's
        self.dumptext = 0       # --dump into the file rings: the dumps' options (layout.DUMP_TEXT_KEY -> DUMP_TEXT)


class ProgramOptions(NamedTuple):
    start: str                       # START_*
    snaplen: int
    filter: list | None = None       # cBPF instructions (code, jt, jf, k) or None
    dynptr_kfunc: int = 0            # BTF id of bpf_dynptr_from_skb when tracing programs may call it
    predicates: list | tuple = ()    # callables (builder) -> items that jump to "out" to drop
    record: str = RECORD_PCAP        # which file record header the program lays out at the end of META
    clock_offset_ns: int = 0         # wall clock - monotonic clock, added to the record header's timestamp
    meta: bool = True                # record pid/tid, comm, mark and netns (not when a pcap file is all they feed)
    task_btf: bool = True            # pid/tid, comm from bpf_get_current_task_btf (5.11+), else the older helpers
    dumps: object = None             # fcap.kernel.dumps.PointDumps: --dump copies, in an area before META (R7 past it)
    head_loads: bool = False         # the verifier lets the program load through skb->head (untrusted memory)
    division_tracked: bool = False   # the verifier tracks ranges through a division (bpf.cbpf's loops: an xor)
    count_seen: bool = False         # file rings: count each record in the counters too (fcap.kernel.stats: ISBs)
    ident: str = "none"              # how records get their packet ids (fcap.kernel.track.mode)
    points: int = 1                  # points of the capture (fcap.kernel.track's seen bits share 64 among them)
    starts_inside_free: bool = False  # packets start at functions inside a free (fcap.kernel.track.only_inside_free)
    stack: bool = False              # --stack: each record's kernel stack id (fcap.kernel.kstack)
    context: bool = False            # --context: record the packet's cgroup (fcap.kernel.context)
    comment: bool = True             # pcapng: a metadata comment in each record (--no-comment: none, nor its inputs)


def scratch_size(point: Point, opts: ProgramOptions) -> int:
    """Bytes of the per-CPU scratch value; for pcapng, the file ring's comment area comes last."""
    if not point.typed:   # (the program copies the bytes itself, and reads the sk_buff from its copy of it)
        size = SKB_SNAP + SKB_SNAP_MAX
    elif point.copies_bytes:
        size = PKT + HDR_MAX + LINEAR_CAP + 8
    elif opts.filter is not None:
        size = PKT + HDR_MAX + FILTER_CAP + 8
    else:
        size = PKT + HDR_MAX + 8
    if opts.record == RECORD_PCAPNG:
        size = (size + 7 & ~7) + CAREA.size
    return size + dump_area(opts)


def dump_area(opts: ProgramOptions) -> int:
    """Bytes of the dump area before META (0 without --dump)."""
    return opts.dumps.size if opts.dumps is not None else 0


class KernelOffsets:
    """Offsets of the kernel structures the program reads, from BTF."""

    def __init__(self, btf: BTF):
        vm = btf.root
        skb = vm.find("sk_buff", "struct")
        dev = vm.find("net_device", "struct")
        net = vm.find("net", "struct")
        if skb is None or dev is None:
            raise ProgramError("this kernel's BTF has no struct sk_buff or struct net_device")

        def off(struct_type, path: str) -> int:
            _m, bits = struct_type.member_path(path) if "." in path else struct_type.member(path)
            return bits // 8

        self.len = off(skb, "len")
        self.head = off(skb, "head")
        self.data = off(skb, "data")
        self.mac = off(skb, "mac_header")
        self.network = off(skb, "network_header")
        self.protocol = off(skb, "protocol")
        self.dev = off(skb, "dev")
        self.mark = off(skb, "mark")
        self.data_len = off(skb, "data_len")
        self.queue_mapping = off(skb, "queue_mapping")
        try:   # (--track's: the byte and bit of the clone flag)
            _m, bits = skb.member("cloned")
            self.cloned: tuple[int, int] | None = (bits // 8, bits % 8)
        except (BTFError, AttributeError):
            self.cloned = None
        m, bits = skb.member("pkt_type")
        self.pkt_type_byte, self.pkt_type_shift = bits // 8, bits % 8
        self.pkt_type_mask = (1 << (m.bitfield_size or 3)) - 1
        # the sk_buff members the program copies into META's fields (fcap.kernel.record's Field.skb): (offset, bytes)
        self.copied = {f.name: _whole_member(skb, f.skb) for f in FIELDS if f.skb}
        self.ifindex = off(dev, "ifindex")
        self.hatype = off(dev, "type")
        self.dev_name = off(dev, "name")
        self.dev_net = off(dev, "nd_net")
        self.net_inum = None
        if net is not None:
            try:
                self.net_inum = off(net, "ns.inum")
            except Exception:  # noqa: BLE001 - older layouts: no netns id, not fatal
                self.net_inum = None
        task = vm.find("task_struct", "struct")
        self.task = None   # (pid, tgid, comm) offsets: read straight from current where the verifier types it
        if task is not None:
            try:
                self.task = (off(task, "pid"), off(task, "tgid"), off(task, "comm"))
            except Exception:  # noqa: BLE001 - the helpers do it otherwise
                self.task = None


def _whole_member(struct_type, name: str) -> tuple[int, int]:
    """(offset, bytes) of a member the program loads whole: 1, 2, 4 or 8 bytes, not a bitfield."""
    m, bits = struct_type.member(name)
    size = m.type.strip().size
    if m.bitfield_size or bits % 8 or size not in (1, 2, 4, 8):
        raise ProgramError(f"sk_buff's {name} is not a member of 1, 2, 4 or 8 bytes on this kernel")
    return bits // 8, size
