"""Packet ids, and --track.

A packet id (pcapng epb_packetid, META's id) names one packet: two packets of a capture never share it, and a
packet keeps it from point to point and across its clones, as far as the kernel lets fcap tell. Ids are made
without contention: this CPU's counter (TRACK_COUNTERS' next, an atomic add; one point's records in a file ring: the
ring's, in_ring) << ID_CPU_BITS | the CPU. How a
record gets its id depends on the capture (mode()):
- IDENT_EACH (one point): every record a new id (a point sees a packet once).
- IDENT_MAP (several points, no --track): the identity map says which packet an skb is; an skb it does not know
  is a new packet.
- IDENT_TRACK (--track): the filter and predicates decide at the first point where a packet passes them; from
  then on its skb is captured at every point, without running them, under the id it got there.

The identity map (fcap.kernel.layout's TRACK, an LRU hash: bounded, the least recently used entries go first) holds two
keys per packet: the skb's address (its value: the id, the head the skb had, the (point, device) pairs it was seen
at) and its data head's address | 1, through which clones (which share the head) are found without a hook on
skb_clone. An skb address is no identity (the kernel hands a freed skb out again at once, and many frees fire no
tracepoint: a UDP socket's read, deferred frees into the per-CPU skb cache, GRO merges), so an entry is checked
before it is trusted (find): the skb's head must be the one recorded, the head's key must still be there with the
same id (a freed head ends it), and the skb must not have been seen at this point and device before. Entries end
where the kernel frees: at kfree_skb and consume_skb (the skb's key, and the head's unless the head is shared),
at kfree and kmem_cache_free (a head's key when the head is freed; an skb's when its memory is). Only an skb
with its cloned bit set joins a packet through the head key (a fresh skb that reuses a freed head is no clone).

Counters (TRACK_COUNTERS): packets started, clones joined, entries deleted; with the entries left at the end they
give the entries the LRU evicted."""

from __future__ import annotations

from bpf import asm, probes
from bpf.asm import (ADD, AND, DW, FP, JEQ, JNE, LSH, OR, R0, R1, R2, R3, R4, R6, R7, R8, R9, W, addi, alu64, andi,
                     call, exit_, jmp, label, ld_map_fd, ldx, mov, movi, st, stx)
from bpf.uapi import Helper

from fcap.errors import ProgramError
from fcap.kernel import pointinfo
from fcap.kernel.parts import BEFORE_FILTER, ENTRY, KEPT, SELECTED, Part, MapUse, has_skb
from fcap.kernel.layout import ID_CPU_BITS, META, RECORD_PCAPNG, STACK, TRACK, TRACK_COUNTERS
from fcap.points import kinds
from fcap.points.spec import Point, tracepoint

IDENT_NONE, IDENT_EACH, IDENT_MAP, IDENT_TRACK = "none", "each", "map", "track"
FREE_POINTS = ("kfree_skb", "consume_skb")   # tracepoints: the skb is freed right after them
# tracepoints of the allocator whose argument 1 is the object: the keys (tags) they end
# (kmem_cache_alloc would end an skb's entry when its address is handed out again after a free no tracepoint saw;
# measured, it runs 4x as often as kmem_cache_free and costs the most, and the check before use catches that new
# life anyway: its head is another, or one whose free kfree saw)
MEMORY_POINTS = (("kfree", (1,)), ("kmem_cache_free", (0, 1)))
SEEN_BITS = 64         # a (point, device) bit each: see seen_slots
# functions that run inside a free after its tracepoint ended the skb's entry (the free's own steps, and the socket
# destructors skb_release_head_state calls): an skb they do not know is the freed packet, not a new one. There no
# packet starts (--track: turned away; else an id of its own, not entered), unless every point of the capture is one.
INSIDE_FREE_FUNCS = frozenset((
    "__kfree_skb", "skb_release_all", "skb_release_head_state", "skb_release_data", "skb_free_head", "kfree_skbmem",
    "napi_skb_cache_put", "__napi_kfree_skb", "_kfree_skb_defer", "skb_zcopy_clear",
    "sock_wfree", "__sock_wfree", "sock_rfree", "tcp_wfree", "sock_efree", "sock_edemux", "sock_pfree", "sock_ofree",
    "unix_destruct_scm", "netlink_skb_destructor", "tpacket_destruct_skb", "xsk_destruct_skb"))


def mode(track: bool, points: int, ids: bool = True) -> str:
    """How records get their packet ids: --track; several points; one point; none (no file that shows them)."""
    if track:
        return IDENT_TRACK
    if not ids:
        return IDENT_NONE
    return IDENT_MAP if points > 1 else IDENT_EACH


def uses_map(ident: str) -> bool:
    return ident in (IDENT_MAP, IDENT_TRACK)


def is_free_point(p: Point) -> bool:
    return not p.kind.function and p.name in FREE_POINTS


def inside_free(p: Point) -> bool:
    """A function that runs inside a free, after its tracepoint (INSIDE_FREE_FUNCS)."""
    return p.kind.function and p.name in INSIDE_FREE_FUNCS


def only_inside_free(points: list[Point]) -> bool:
    """Every point of a capture runs inside a free (then packets start there as anywhere)."""
    return bool(points) and all(inside_free(p) for p in points)


# ---- map operations on STACK.track_key / STACK.track_val -------------------------------------------------------

def _count(b, field: str) -> None:
    """TRACK_COUNTERS[field] += 1 (this CPU's)."""
    done = b.fresh("tc")
    b.emit(st(W, FP, STACK.track_ckey, 0), ld_map_fd(R1, b.maps.track_counters), mov(R2, FP),
           addi(R2, STACK.track_ckey), call(Helper.map_lookup_elem), jmp(JEQ, R0, 0, done),
           TRACK_COUNTERS.load(R1, R0, field), addi(R1, 1), TRACK_COUNTERS.store(R0, field, R1), label(done))


def _key(b, reg: int, tag: int = 0) -> None:
    b.emit(stx(DW, FP, STACK.track_key, reg))
    if tag:
        b.emit(ldx(DW, R1, FP, STACK.track_key), alu64(OR, R1, tag), stx(DW, FP, STACK.track_key, R1))


def _stash_key(b) -> None:
    """STACK.track_key = argument 0's value (the skb's address, read from the context in STACK.ctx as a number: the
    verifier types the argument a pointer, which takes no |) | COPY_TAG. Uses R0-R5."""
    b.emit(ldx(DW, R3, FP, STACK.ctx), mov(R1, FP), addi(R1, STACK.track_key), movi(R2, 8),
           call(Helper.probe_read_kernel), ldx(DW, R1, FP, STACK.track_key), alu64(OR, R1, COPY_TAG),
           stx(DW, FP, STACK.track_key, R1))


def _insert(b) -> None:
    """map[STACK.track_key] = STACK.track_val (an LRU map makes room: it never refuses for want of it)."""
    b.emit(ld_map_fd(R1, b.maps.track), mov(R2, FP), addi(R2, STACK.track_key), mov(R3, FP), addi(R3, STACK.track_val),
           movi(R4, 0), call(Helper.map_update_elem))


def _delete(b) -> None:
    done = b.fresh("td")
    b.emit(ld_map_fd(R1, b.maps.track), mov(R2, FP), addi(R2, STACK.track_key), call(Helper.map_delete_elem),
           jmp(JNE, R0, 0, done))
    _count(b, "deleted")
    b.emit(label(done))


def _lookup(b, miss: str) -> None:
    b.emit(ld_map_fd(R1, b.maps.track), mov(R2, FP), addi(R2, STACK.track_key), call(Helper.map_lookup_elem),
           jmp(JEQ, R0, 0, miss))


def _forget(b) -> None:
    """Delete STACK.track_key where it is there: a lookup first (it takes no lock; a delete takes the bucket's)."""
    absent = b.fresh("tabsent")
    _lookup(b, absent)
    _delete(b)
    b.emit(label(absent))


# ---- ids -------------------------------------------------------------------------------------------------------

def _new_id(b) -> None:
    """STACK.track_id = a new packet id: (this CPU's counter + 1) << ID_CPU_BITS | cpu. Uses R0-R5."""
    b.emit(st(W, FP, STACK.track_ckey, 0), ld_map_fd(R1, b.maps.track_counters), mov(R2, FP),
           addi(R2, STACK.track_ckey), call(Helper.map_lookup_elem), jmp(JEQ, R0, 0, "out"), movi(R1, 1))
    off = TRACK_COUNTERS.off("next")
    if probes.atomic_fetch() is None:
        b.emit(asm.fetch_add(DW, R0, off, R1), addi(R1, 1))
    else:   # (5.10: an add, then a load; a program nested on this CPU between them would take the same id)
        b.emit(asm.atomic_add(DW, R0, off, R1), ldx(DW, R1, R0, off))
    b.emit(asm.lshi(R1, ID_CPU_BITS), stx(DW, FP, STACK.track_id, R1), call(Helper.get_smp_processor_id),
           andi(R0, (1 << ID_CPU_BITS) - 1), ldx(DW, R1, FP, STACK.track_id), alu64(OR, R1, R0, reg=True),
           stx(DW, FP, STACK.track_id, R1))


def seen_slots(points: int) -> int:
    """Bits per point in an entry's seen mask: each point its own power-of-two share of the 64 (the device's ifindex
    modulo it picks the bit); 0 past 64 points (no check: bits shared between points would split packets)."""
    if points > SEEN_BITS:
        return 0
    return 1 << (SEEN_BITS // max(points, 1)).bit_length() - 1


def _seen_bit(b) -> None:
    """STACK.track_bit = this point and device's bit: 1 << (point * slots + ifindex % slots); 0 (nothing checked)
    past 64 points. R6 skb; uses R0-R5, R8."""
    slots = seen_slots(b.options.points)
    if not slots:
        b.emit(st(DW, FP, STACK.track_bit, 0))
        return
    dev, done = b.fresh("tdev"), b.fresh("tdevdone")
    b.read(DW, R8, R6, b.offsets.dev)
    b.emit(jmp(JNE, R8, 0, dev), movi(R8, 0), asm.ja(done), label(dev))
    b.read(W, R8, R8, b.offsets.ifindex)
    b.emit(label(done), andi(R8, slots - 1))
    if b.point.kind.multi:   # (the point id is the attach cookie: known only when the program runs)
        b.emit(b.point_id(R0), asm.lshi(R0, slots.bit_length() - 1), alu64(ADD, R8, R0, reg=True))
    else:
        b.emit(addi(R8, b.point.id * slots % SEEN_BITS))
    b.emit(andi(R8, SEEN_BITS - 1), movi(R0, 1), alu64(LSH, R0, R8, reg=True), stx(DW, FP, STACK.track_bit, R0))


def _find(b, found: str) -> None:
    """Is this skb (R6) a known packet? Its entry counts only when the skb's head is the one recorded, the head's
    entry is still there with the same id, and the skb was not seen at this point and device before; a stale entry
    goes. An skb without one, cloned, whose head has an entry, is a clone of that packet: it joins. Known: on to
    `found` with STACK.track_id = the id, this point marked seen; else STACK.track_id = 0 and on. An skb of no
    packet costs one lookup and one read (its cloned bit): the point's bit and the head are read only for an skb
    the map knows or a clone. Uses R0-R5, R8, R9."""
    stale, byhead, unknown = b.fresh("tstale"), b.fresh("tbyhead"), b.fresh("tunknown")
    b.emit(st(DW, FP, STACK.track_id, 0))
    _key(b, R6)
    _lookup(b, byhead)
    b.emit(mov(R9, R0))
    _seen_bit(b)
    b.read(DW, R8, R6, b.offsets.head)
    b.emit(TRACK.load(R1, R9, "head"), jmp(JNE, R1, R8, stale, reg=True),
           TRACK.load(R1, R9, "seen"), ldx(DW, R2, FP, STACK.track_bit), alu64(AND, R1, R2, reg=True),
           jmp(JNE, R1, 0, stale))
    _key(b, R8, 1)
    _lookup(b, stale)
    b.emit(TRACK.load(R1, R0, "id"), TRACK.load(R2, R9, "id"), jmp(JNE, R1, R2, stale, reg=True),
           stx(DW, FP, STACK.track_id, R1), TRACK.load(R1, R9, "seen"), ldx(DW, R2, FP, STACK.track_bit),
           alu64(OR, R1, R2, reg=True), TRACK.store(R9, "seen", R1), asm.ja(found), label(stale))
    _key(b, R6)
    _delete(b)
    b.emit(label(byhead))
    byte, bit = _cloned_bit(b)
    b.read(asm.B, R1, R6, byte)
    b.emit(asm.rshi(R1, bit), andi(R1, 1), jmp(JEQ, R1, 0, unknown))
    _seen_bit(b)
    b.read(DW, R8, R6, b.offsets.head)
    _key(b, R8, 1)
    _lookup(b, unknown)
    # a clone of a known packet (the same head): under its id, and by its own address
    b.emit(TRACK.load(R1, R0, "id"), stx(DW, FP, STACK.track_id, R1),
           stx(DW, FP, STACK.track_val + TRACK.off("id"), R1), stx(DW, FP, STACK.track_val + TRACK.off("head"), R8),
           ldx(DW, R1, FP, STACK.track_bit),
           stx(DW, FP, STACK.track_val + TRACK.off("seen"), R1))
    _count(b, "joined")
    _key(b, R6)
    _insert(b)
    b.emit(asm.ja(found), label(unknown))


def _start(b) -> None:
    """A new packet (R6): a new id in STACK.track_id, entered by the skb's address and its head's (an old head key
    left by a free fcap did not see goes first), seen at this point and device. Uses R0-R5, R8."""
    _seen_bit(b)
    _new_id(b)
    b.read(DW, R8, R6, b.offsets.head)
    b.emit(ldx(DW, R1, FP, STACK.track_id), stx(DW, FP, STACK.track_val + TRACK.off("id"), R1),
           stx(DW, FP, STACK.track_val + TRACK.off("head"), R8), ldx(DW, R1, FP, STACK.track_bit),
           stx(DW, FP, STACK.track_val + TRACK.off("seen"), R1))
    _count(b, "started")
    _key(b, R6)
    _insert(b)
    _key(b, R8, 1)
    _forget(b)
    _insert(b)


def _start_unless_inside_free(b) -> None:
    """An skb the map does not know (R6): a new packet (_start), except at a function inside a free (a multi-attach
    program: its cookie's bit says): there --track turns it away and otherwise it gets an id of its own, not entered.
    On to the label where the id is known (_shared) either way."""
    if b.options.starts_inside_free:
        _start(b)
        return
    if not b.point.kind.multi and not inside_free(b.point):
        _start(b)
        return
    starts = b.fresh("tstarts")
    if b.point.kind.multi:
        b.emit(pointinfo.unless(R0, pointinfo.INSIDE_FREE, starts))
    if b.options.ident == IDENT_TRACK:
        b.emit(asm.ja("out"))
    else:
        _new_id(b)
        b.emit(asm.ja(_shared(b).known))
    if b.point.kind.multi:
        b.emit(label(starts))
        _start(b)


# ---- in the capture program ------------------------------------------------------------------------------------

def _shared(b):
    """The labels --track's code at several stages jumps across: where tracked skbs come in past the predicates,
    past the filter, and where the packet's id is known."""
    return b.shared_names("trk", "tracked", "filtered", "known")


def emit_lookup(b) -> None:
    """--track, before the predicates: is this skb tracked? STACK.track_id = its packet id (0: no); tracked skbs
    jump past the predicates to where they come in (emit_tracked_label). R6 skb, R7 scratch; uses R0-R5, R8, R9."""
    _find(b, _shared(b).tracked)


def emit_tracked_label(b) -> None:
    """After the predicates: where tracked skbs come in."""
    b.emit(label(_shared(b).tracked))


def emit_skip_filter(b) -> None:
    """Before the filter (where there is one): tracked skbs go past it (to emit_filter_done's label)."""
    if b.options.filter is not None:
        b.emit(ldx(DW, R0, FP, STACK.track_id), jmp(JNE, R0, 0, _shared(b).filtered))


def in_ring(point: Point, options, maps) -> bool:
    """Whether one point's records (IDENT_EACH) take their ids in the file ring they go to (BTF-typed points with the
    session's rings: fcap.kernel.ringrec.writes_ring), while the program holds it: from the ring's own counter
    (RING's next_id) by a plain add, as a program nested on this CPU finds the ring held and takes none. No map
    lookup, and no locked add, which waits for every store of the record made so far to reach the cache. (pcapng:
    a pcap record shows no id.)"""
    return (options.ident == IDENT_EACH and options.record == RECORD_PCAPNG and bool(point.typed and maps.ring)
            and not maps.frags)   # (else some records go through the perf buffer, frags without skb dynptrs or
    #                                   texts user space has not given yet: ids from the counter, theirs too)


def emit_filter_done(b) -> None:
    """After the filter (the packet will be recorded): META's id. With the map: the packet's, or a new one (then
    the packet is entered, except at a free point); at a free point the skb's keys go. Uses R0-R5, R8, R9."""
    ident = b.options.ident
    if in_ring(b.point, b.options, b.maps):
        return
    if ident == IDENT_EACH:
        _new_id(b)
    else:
        if ident == IDENT_TRACK:
            b.emit(label(_shared(b).filtered), ldx(DW, R1, FP, STACK.track_id), jmp(JNE, R1, 0, _shared(b).known))
        else:
            _find(b, _shared(b).known)
        if is_free_point(b.point):
            _new_id(b)
        else:
            _start_unless_inside_free(b)
        b.emit(label(_shared(b).known))
    b.emit(ldx(DW, R1, FP, STACK.track_id), META.store(R7, "id", R1))
    if uses_map(ident) and is_free_point(b.point):
        emit_untrack(b)


def emit_untrack(b) -> None:
    """The skb (R6) is freed: its key goes, and its head's unless the head is shared (skb->cloned). Uses R0-R4, R8."""
    _key(b, R6)
    _delete(b)
    byte, bit = _cloned_bit(b)
    shared = b.fresh("tshared")
    b.read(asm.B, R8, R6, byte)
    b.emit(asm.rshi(R8, bit), andi(R8, 1), jmp(JNE, R8, 0, shared))
    b.read(DW, R8, R6, b.offsets.head)
    _key(b, R8, 1)
    _delete(b)
    b.emit(label(shared))


def _cloned_bit(b) -> tuple[int, int]:
    if b.offsets.cloned is None:
        raise ProgramError("--track: this kernel's struct sk_buff has no 'cloned' bit")
    return b.offsets.cloned


_MAP = MapUse("track", "the identity map: LRU hash, skb or head address -> TRACK (fcap.kernel.layout); the session's, "
                      "sized by --track-max")
_COUNTERS = MapUse("track_counters", "PERCPU_ARRAY, one TRACK_COUNTERS value: the id counters and the map's counts; "
                                     "the session's")
PACKET_IDS = Part("packet ids", on=lambda point, options, maps: options.ident != IDENT_NONE and has_skb(point),
                     stages={KEPT: emit_filter_done}, fields=("id",), maps=(_MAP, _COUNTERS),
                     reads="fcap.kernel.track.read_counters")
TRACKING = Part("track", on=lambda point, options, maps: options.ident == IDENT_TRACK and has_skb(point),
                   stages={ENTRY: emit_lookup, SELECTED: emit_tracked_label, BEFORE_FILTER: emit_skip_filter},
                   turns_away=True,
                   maps=(_MAP, _COUNTERS), reads="fcap.kernel.track.evicted")


# ---- helper programs: where the kernel frees -------------------------------------------------------------------

def untrack_program(b) -> list:
    """A program at a free tracepoint that is not captured: it only forgets the freed skb."""
    b.emit(ldx(DW, R6, R1, 0), jmp(JEQ, R6, 0, "out"))
    emit_untrack(b)
    b.emit(label("out"), movi(R0, 0), exit_())
    return b.items


def forget_program(b, tags: tuple) -> list:
    """A program at an allocator tracepoint (argument 1: the object): the keys object | tag for each tag go when
    there (a lookup first: it takes no lock)."""
    b.emit(ldx(DW, R6, R1, 8), jmp(JEQ, R6, 0, "out"))
    for tag in tags:
        _key(b, R6, tag)
        _forget(b)
    b.emit(label("out"), movi(R0, 0), exit_())
    return b.items


# ---- helper programs: where the kernel copies (--track) ---------------------------------------------------------
# The functions that make a packet's skb anew, or give it a new head, with the packet's bytes: (name, what the
# function returns: "skb" the skb it made, "status" 0 when it gave the skb (argument 0) a new head). A copy made
# there is the same packet: fentry sets the tracked skb's id aside (its key | COPY_TAG: the function may free the
# skb before it returns), fexit gives it to the skb returned, by its address and its new head's.
COPY_FUNCS = (("skb_copy", "skb"), ("__pskb_copy_fclone", "skb"), ("skb_copy_expand", "skb"),
              ("skb_realloc_headroom", "skb"), ("skb_expand_head", "skb"), ("pskb_expand_head", "status"))
COPY_TAG = 2
COPY_NAMES = frozenset(name for name, _r in COPY_FUNCS)


def copy_entry_program(b) -> list:
    """fentry at a copy function: a tracked skb's entry (its head the recorded one, the head's entry the same id)
    copied under its key | COPY_TAG."""
    b.emit(stx(DW, FP, STACK.ctx, R1), ldx(DW, R6, R1, 0), jmp(JEQ, R6, 0, "out"))
    _key(b, R6)
    _lookup(b, "out")
    b.emit(mov(R9, R0))
    b.read(DW, R8, R6, b.offsets.head)
    b.emit(TRACK.load(R1, R9, "head"), jmp(JNE, R1, R8, "out", reg=True))
    _key(b, R8, 1)
    _lookup(b, "out")
    b.emit(TRACK.load(R1, R0, "id"), TRACK.load(R2, R9, "id"), jmp(JNE, R1, R2, "out", reg=True),
           stx(DW, FP, STACK.track_val + TRACK.off("id"), R1), stx(DW, FP, STACK.track_val + TRACK.off("head"), R8),
           TRACK.load(R1, R9, "seen"), stx(DW, FP, STACK.track_val + TRACK.off("seen"), R1))
    _stash_key(b)
    _insert(b)
    b.emit(label("out"), movi(R0, 0), exit_())
    return b.items


def copy_exit_program(b, returns: str) -> list:
    """fexit at a copy function: the id set aside at its entry (taken out) to the skb it made (seen nowhere yet),
    or, where it gave argument 0 a new head, to that skb again (its points seen kept), keyed by its new head too."""
    ret = 8 * len(b.point.params)
    b.emit(ldx(DW, R6, R1, 0), jmp(JEQ, R6, 0, "out"), stx(DW, FP, STACK.ctx, R1))
    _stash_key(b)
    _lookup(b, "out")
    b.emit(TRACK.load(R1, R0, "id"), stx(DW, FP, STACK.track_val + TRACK.off("id"), R1),
           TRACK.load(R1, R0, "seen"), stx(DW, FP, STACK.track_val + TRACK.off("seen"), R1),
           ld_map_fd(R1, b.maps.track), mov(R2, FP), addi(R2, STACK.track_key), call(Helper.map_delete_elem),
           ldx(DW, R1, FP, STACK.ctx), ldx(DW, R0, R1, ret))
    if returns == "skb":   # another skb: seen nowhere yet; the same (a new head only): as below
        b.emit(jmp(JEQ, R0, 0, "out"), jmp(JEQ, R0, R6, "same", reg=True), mov(R6, R0),
               st(DW, FP, STACK.track_val + TRACK.off("seen"), 0))
        _enter(b, "copied")
        b.emit(asm.ja("out"), label("same"))
    else:
        b.emit(jmp(JNE, R0, 0, "out"))
    _enter(b, "rehomed")
    b.emit(label("out"), movi(R0, 0), exit_())
    return b.items


def _enter(b, counter: str) -> None:
    """The skb (R6) entered with STACK.track_val's id and seen, by its address and its head's; counted. Uses R0-R5,
    R8."""
    b.read(DW, R8, R6, b.offsets.head)
    b.emit(stx(DW, FP, STACK.track_val + TRACK.off("head"), R8))
    _key(b, R6)
    _insert(b)
    _key(b, R8, 1)
    _insert(b)
    _count(b, counter)


def copy_points() -> list[tuple[Point, Point, str]]:
    """(fentry point, fexit point, what it returns) of each copy function this kernel has and lets fcap trace
    (fentry and fexit both load there); [] where it refuses them (no trampolines)."""
    from fcap.points.spec import PointError, resolve
    out = []
    for name, returns in COPY_FUNCS:
        try:
            entry, exit_point = resolve(f"fentry/{name}"), resolve(f"fexit/{name}")
        except PointError:
            continue
        if kinds.FENTRY.probe(entry.btf_id) is None and kinds.FEXIT.probe(exit_point.btf_id) is None:
            out.append((entry, exit_point, returns))
    return out


def helpers(captured: list[Point], first_id: int, builder, copies: bool = False) -> list[tuple[Point, list]]:
    """The helper programs a capture with the identity map needs: (point, instructions); with `copies` (--track),
    those that follow a packet into its copies where the kernel lets them. builder(point) makes a
    fcap.kernel.program.Builder for one."""
    names = {p.name for p in captured if not p.kind.function}
    out = []
    for name in FREE_POINTS:
        if name not in names:
            p = tracepoint(name)
            if p is not None:
                out.append((p, lambda b: untrack_program(b)))
    for name, tags in MEMORY_POINTS:
        # (raw_tp: its context is plain u64s; tp_btf refuses a `const void *` argument before 6.x's later kernels)
        p = tracepoint(name, kinds.RAW_TP)
        if p is not None and len(p.params) > 1 and p.params[1].type.strip().kind == "ptr":
            out.append((p, lambda b, tags=tags: forget_program(b, tags)))
    for entry, exit_point, returns in copy_points() if copies else ():
        out += [(entry, copy_entry_program), (exit_point, lambda b, returns=returns: copy_exit_program(b, returns))]
    progs = []
    for i, (p, make) in enumerate(out):
        p.id = first_id + i
        progs.append((p, make(builder(p))))
    return progs


def evicted(counters, remaining: int) -> int:
    """Entries the LRU evicted: inserted (two per packet and per copy, one per clone and per new head) - deleted -
    still there."""
    c = read_counters(counters)
    inserted = 2 * (c["started"] + c["copied"]) + c["joined"] + c["rehomed"]
    return max(inserted - c["deleted"] - remaining, 0)


def read_counters(counters) -> dict[str, int]:
    return {n: counters.sum_u64(0, TRACK_COUNTERS.off(n)) for n in ("started", "joined", "deleted", "copied",
                                                                     "rehomed")}
