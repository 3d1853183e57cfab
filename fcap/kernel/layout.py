"""The capture record, declared once: the metadata the program writes ahead of each packet's bytes, the per-CPU
scratch value and stack slots it works in, the file rings' control words, the pcapng comment's format; both the
program builder and user space take offsets, sizes and names from here."""

from __future__ import annotations

import operator
import struct
from collections import namedtuple
from typing import NamedTuple

from fcap.defaults import SNAPLEN
from fcap.errors import ProgramError
from fcap.kernel import record
from fcap.files.pcapfile import (BT_EPB, EPB_FLAGS, EPB_OPTION_ORDER, EPB_PACKETID, EPB_QUEUE, EPB_VERDICT,
                                 FLAG_INBOUND, FLAG_OUTBOUND, OPT_COMMENT)


class Layout:
    """A packed little-endian structure declared as (name, struct format) pairs ("" names padding): its offsets,
    widths, a reader by name and eBPF loads/stores of its fields, all derived from the one declaration."""

    def __init__(self, name: str, fields: tuple):
        self.struct = struct.Struct("<" + "".join(fmt for _, fmt in fields))
        self.size = self.struct.size
        self._at: dict[str, tuple[int, int]] = {}
        pos = 0
        for fname, fmt in fields:
            width = struct.calcsize("<" + fmt)
            if fname:
                self._at[fname] = (pos, width)
            pos += width
        self.Tuple = namedtuple(name, [f for f, fmt in fields if f and not fmt.endswith("x")])

    def off(self, name: str) -> int:
        return self._at[name][0]

    def width(self, name: str) -> int:
        return self._at[name][1]

    def end(self, name: str) -> int:
        off, width = self._at[name]
        return off + width

    def unpack(self, buf, at: int = 0):
        return self.Tuple._make(self.struct.unpack_from(buf, at))

    # (the assembler imported where a program is made, not by the readers: fcap -r's start-up)
    def load(self, dst: int, base: int, name: str, at: int = 0):
        """dst = the field `name` of the structure at base + at (a bpf.asm.Insn)."""
        from bpf.asm import BYTES_SIZE, ldx
        off, width = self._at[name]
        return ldx(BYTES_SIZE[width], dst, base, at + off)

    def store(self, base: int, name: str, src: int, at: int = 0):
        from bpf.asm import BYTES_SIZE, stx
        off, width = self._at[name]
        return stx(BYTES_SIZE[width], base, at + off, src)

    def store_imm(self, base: int, name: str, imm: int, at: int = 0):
        from bpf.asm import BYTES_SIZE, st
        off, width = self._at[name]
        return st(BYTES_SIZE[width], base, at + off, imm)

    def words(self, names: tuple) -> list[tuple[int, int]]:
        """(offset, bytes) loads of at most 8 aligned bytes that cover the named fields, adjacent ones merged."""
        spans: list[list[int]] = []
        for off, width in sorted(self._at[n] for n in names):
            if spans and spans[-1][1] == off:
                spans[-1][1] = off + width
            else:
                spans.append([off, off + width])
        out = []
        for start, stop in spans:
            while start < stop:
                n = next(n for n in (8, 4, 2, 1) if start % n == 0 and start + n <= stop)
                out.append((start, n))
                start += n
        return out


# ---- the metadata record: META bytes, then the made-up link header and header bytes, then the skb's bytes -------
def meta_fields(fields: tuple = record.FIELDS, header: tuple = record.FILE_HEADER) -> tuple:
    """META's (name, struct format) pairs from the fields' declarations (fcap.kernel.record): each field at its
    natural alignment (padding put in before it; fast on 8 bytes), the file's record header last, the whole a
    multiple of 8 bytes.
    A layout that breaks the rules the program and the drains rely on is refused (ProgramError): ts first, then id,
    then skb, fast last, so that every other field lies from skb to fast (fcap.live.drain caches a block's options
    by those bytes); the header pcap's 16 bytes and an EPB's 28 (asserted below)."""
    out, pos = [], 0

    def put(name: str, fmt: str, align: int) -> None:
        nonlocal pos
        if pos % align:
            out.append(("", f"{align - pos % align}x"))
            pos += align - pos % align
        out.append((name, fmt))
        pos += struct.calcsize("<" + fmt)

    for f in fields:   # (fast on a word: the options' key from skb to fast is whole u64s, fcap.live.perfwalk's hash)
        size = struct.calcsize("<" + f.fmt)
        put(f.name, f.fmt, 8 if f.name == "fast" else min(8, size & -size))
    names = [f.name for f in fields]
    if names[:3] != ["ts", "id", "skb"] or names[-1] != "fast":   # (so every other field lies from skb to fast)
        raise ProgramError("fcap.kernel.record.FIELDS: ts, id and skb come first, fast last")
    tail = struct.calcsize("<" + "".join(f.fmt for f in header))
    if pos + tail & 7:
        out.append(("", f"{-(pos + tail) & 7}x"))
    out.extend((f.name, f.fmt) for f in header)
    return tuple(out)


META = Layout("Meta", meta_fields())
META_SIZE = META.size
PCAP_REC, EPB_REC = META.off("ts1"), META.off("btype")   # where each format's record header starts
PCAP_HDR, EPB_HDR = META_SIZE - PCAP_REC, META_SIZE - EPB_REC
assert PCAP_HDR == 16 and EPB_HDR == 28, "fcap.kernel.record.FILE_HEADER: pcap's and an EPB's"

RECORD_PCAP, RECORD_PCAPNG = "pcap", "pcapng"   # which file record header the program lays out
# where a linktype's bytes start in the skb (the program's ProgramOptions.start)
START_MAC, START_NETWORK, START_DATA, START_SLL2 = "mac", "network", "data", "sll2"

FLAG_MAC_SYNTH = 1      # no MAC header: a zero Ethernet header was made up
FLAG_LINEAR_ONLY = 2    # the filter saw only the linear part (no skb dynptr on this kernel)
FLAG_QUEUE = 4          # queue holds the packet's device queue (pcapng: epb_queue)
STACK_NONE = 0xFFFF     # META's stack: the kernel could not store the stack (its ids are below this)

# pcapng as the program writes it (the writer's if_tsresol is 9: nanoseconds)
PCAPNG_EPB, PCAPNG_FLAGS, PCAPNG_PACKETID, PCAPNG_COMMENT = BT_EPB, EPB_FLAGS, EPB_PACKETID, OPT_COMMENT
PCAPNG_QUEUE, PCAPNG_VERDICT = EPB_QUEUE, EPB_VERDICT
PCAPNG_OPTIONS = EPB_OPTION_ORDER   # the order of an EPB's options, the writer's and the program's
EPB_DIRECTION = {"out": FLAG_OUTBOUND, "in": FLAG_INBOUND}   # epb_flags for a point's direction

# ---- the scratch value (per CPU, per point): META, then the packet's bytes as the record carries them ----------
PKT = META_SIZE          # offset of the packet bytes in the scratch value
PREFIX_MAX = 256         # header bytes before skb->data the program can reach (MAC + network + transport ...)
SYNTH_MAX = 20           # a made-up link header: LINUX_SLL2 (20) or Ethernet (14)
HDR_MAX = SYNTH_MAX + PREFIX_MAX
FILTER_CAP = 512         # packet bytes copied for the filter to read (loads past it take the slow path)
LINEAR_CAP = 4096        # packet bytes untyped points (raw_tp, kprobe) copy: linear data only
# untyped points' copy of the sk_buff (fcap.kernel.snapshot), after the packet bytes: the struct's bytes at their own
# offsets from SKB_SNAP (only the range the program reads is copied); members past SKB_SNAP_MAX are read one by one
SKB_SNAP = PKT + HDR_MAX + LINEAR_CAP + 8 + 7 & ~7
SKB_SNAP_MAX = 256
PERF_RAW_MAX = 65535 - 8 - 4 - 8   # a perf sample is at most 64 KiB, header and padding included
COPY_MAX = PERF_RAW_MAX - META_SIZE - HDR_MAX
CAPLEN_MAX = HDR_MAX + COPY_MAX
# the file rings (kernel.ringrec) have no perf sample limit: a record holds up to tcpdump's largest snap length, so a
# GSO/BIG TCP skb larger than 64 KiB lands whole
RING_CAPLEN_MAX = SNAPLEN
RING_COPY_MAX = RING_CAPLEN_MAX - HDR_MAX

# ---- typed dumps (--dump, fcap.kernel.dumps): an area before META, in the scratch value and at the start of the perf
# sample; one slot per --dump PATH: this header, then the bytes copied (padded to 8). The program's R7 points past
# the area (at META), so that every META offset stays what it is.
DUMP = Layout("DumpHeader", (
    ("addr", "Q"),         # where the bytes were read (0: the argument's value itself)
    ("status", "i"),       # DUMP_OK, DUMP_NULL, or the read's -errno
    ("size", "H"),         # bytes copied
    ("null_at", "H"),      # DUMP_NULL: the number of pointers loaded before the NULL one
))
DUMP_OK, DUMP_NULL = 0, 1
DUMP_MAX = 4096          # bytes of one dump (struct net_device is 2,496 bytes on 6.18; larger types are cut)
DUMPS_MAX = 16384        # all the dumps of a record
# --dump into the file rings: a record's dump options (a comment and a custom option each, as fcap.files.pcapfile
# lays them out), which user space gives the programs under the hash of the dumps (META's dumps) when it first sees
# it; they copy them after the comment (fcap.kernel.ringrec). Longer: the perf buffer, every time (and a capture
# whose dumps' options may well be longer, fcap.kernel.dumps.fit_rings, leaves the rings to the perf buffer's
# records: a struct nf_conn's take ~4-6 KiB, a struct net_device's ~10-26)
DUMP_OPTS_MAX = 4088
DUMP_TEXT_KEY = Layout("DumpTextKey", (("hash", "Q"),))
DUMP_TEXT = Layout("DumpText", (("len", "Q"), ("text", f"{DUMP_OPTS_MAX}s")))

# ---- the counters (per CPU, per point): u64s -------------------------------------------------------------------
COUNTER_SEEN, COUNTER_LOST, COUNTER_HITS = 0, 1, 2   # (hits: only where predicates or a filter run, fcap.kernel.stats)
COUNTERS = 3

# ---- fcap drops (commands.drop_report): drops counted per (reason, location) in a hash map of u64 counts ---------
DROP_KEY = Layout("DropKey", (("reason", "I"), ("", "4x"), ("location", "Q")))

# ---- --track (kernel.track): the tracking map (an LRU hash) and its counters (per CPU, one element) -----------------
# Keys: an skb's address, and a data head's address | 1 (clones share the head); values: the packet id, the head
# the skb had when it was tracked, and a bit per (point, device) where the skb was seen (fcap.kernel.track.seen_slots).
TRACK = Layout("Track", (("id", "Q"), ("head", "Q"), ("seen", "Q")))
TRACK_COUNTERS = Layout("TrackCounters", (
    ("started", "Q"),      # packets given an id in the map (--track: that the filter and predicates chose)
    ("joined", "Q"),       # skbs found by their head: clones of a known packet
    ("deleted", "Q"),      # map entries removed (freed, or found stale); inserted: 2 per packet, 1 per clone
    ("next", "Q"),         # this CPU's packet id counter (ids are next << ID_CPU_BITS | cpu)
    ("copied", "Q"),       # --track: new skbs a copy function made of a tracked packet, under its id (2 keys each)
    ("rehomed", "Q"),      # --track: tracked skbs a copy function gave a new head (1 key each)
))
ID_CPU_BITS = 12


# ---- stack slots: (offset from the frame pointer, bytes); checked for overlaps below -------------------------------
class _Stack(NamedTuple):
    key: int = -4            # u32 key (the point id) for the scratch and counter lookups
    point_bits: int = -8     # u32: a multi-attach program's point's bits (fcap.kernel.pointinfo, from the cookie)
    tmp: int = -16           # 8-byte temporary for untyped reads
    dynptr: int = -32        # struct bpf_dynptr (16 bytes)
    head: int = -40          # skb->head
    dataoff: int = -48       # skb->data - skb->head
    wirelen: int = -56       # the filter's packet length
    n: int = -64             # a byte count kept across a call
    skb: int = -72           # the skb while the filter runs
    ctx: int = -80           # the program's context (perf_event_output wants it)
    slow: int = -88          # slow-load destination
    cbpf: int = -160         # cBPF M[] (64 bytes)
    comm: int = -192         # 16 bytes the predicates compare strings in
    ring_key: int = -200     # u32: this CPU's file ring
    ring_off: int = -208     # where this record starts in the ring
    ring_len: int = -216     # the record's length
    bell: int = -224         # the 8-byte doorbell sample
    text_len: int = -232     # the comment's length
    scratch: int = -240      # the scratch value while the filter runs (R7 may be the translator's)
    track_key: int = -248    # the identity map (fcap.kernel.track): a key (an skb's or a head's address)
    track_val: int = -328    # --track: a value to insert (TRACK, 24 bytes)
    track_bit: int = -336    # the identity map: this point and device's seen bit (fcap.kernel.track)
    track_id: int = -272     # --track: the packet id when the skb is tracked, else 0
    track_ckey: int = -276   # --track: u32 key 0 of the tracking counters
    drop_key: int = -296     # fcap drops: the counting map's key (DROP_KEY, 16 bytes)
    drop_one: int = -304     # fcap drops: the value 1 to insert
    frames: int = -384       # a drop function's stack, where its caller is found (fcap.points.kinds.CALLER_FRAMES)
    ctx_key: int = -400      # --context into the file rings: the names' key (CTX_KEY, 16 bytes)
    ctx_val: int = -408      # ... the map value found (CTX_TEXT)
    ctx_copy: int = -416     # ... the record's copy length, kept across the lookup
    ctx_len: int = -424      # ... the text's length, read once
    given_key: int = -440    # the file rings: the key of a text user space gives (STK_KEY, DROP_TEXT_KEY; 16 bytes)
    given_at: int = -448     # ... where the comment's option starts, kept across a text's copy
    stk_val: int = -456      # --stack's: the map value found (STK_TEXT)
    stk_len: int = -464      # ... its text's length, read once
    drop_val: int = -472     # a drop's names: the map value found (DROP_TEXT)
    drop_len: int = -480     # ... its text's length, read once
    nft_val: int = -488      # --nft's: the map value found (NFT_TEXT)
    nft_len: int = -496      # ... its text's length, read once
    dump_val: int = -504     # --dump's options: the map value found (DUMP_TEXT)
    dump_len: int = -512     # ... their length, read once
    nft_hdr: int = -160      # --nft: a netfilter drop's first network header bytes (NFT_HDR), at DEVICE (in cbpf's
                             # bytes: the filter runs later; fcap.kernel.nftverdict)


STACK = _Stack()
_STACK_BYTES = {"key": 4, "point_bits": 4, "dynptr": 16,
                "cbpf": 64, "comm": 16, "ring_key": 4, "track_val": 24, "track_ckey": 4,
                "drop_key": 16, "frames": 48, "ctx_key": 16, "given_key": 16, "nft_hdr": 32}
_STACK_SHARED = {"nft_hdr": "cbpf"}   # slots in another's bytes, used and done with before the other's first use


def _check_stack() -> None:
    for name, within in _STACK_SHARED.items():
        start, outer = getattr(STACK, name), getattr(STACK, within)
        assert outer <= start and start + _STACK_BYTES[name] <= outer + _STACK_BYTES[within], name
    slots = sorted((off, off + _STACK_BYTES.get(name, 8), name) for name, off in STACK._asdict().items()
                   if name not in _STACK_SHARED)
    for (_o, end, name), (nxt, _e, other) in zip(slots, slots[1:]):
        assert end <= nxt, f"stack slots {name} and {other} overlap"
    assert slots[0][0] >= -512 and slots[-1][1] <= 0


_check_stack()

# ---- the file ring (kernel.ringrec writes it, live.drain reads it) -------------------------------------------------
# An mmapable array map, one element per possible CPU: RING_CTRL bytes of control words, then the ring, then
# RING_SLACK bytes past its end. The program appends whole records at head and publishes them with one store-release
# (an atomic add before 6.15): the low HEAD_BITS bits of head are the byte position, the high bits count records.
# Only the program holding the ring (busy) writes head; user space writes
# [tail, head) as it is and stores head's position in tail. A record that runs past the ring's end is written on
# into the slack and its overflow copied to the ring's start, so the stream is contiguous modulo the ring's size.
# When a record leaves a quarter of the ring or more in use and bell is 0, the program sets bell and rings user
# space through the perf buffer (8 bytes); user space clears it once it has written the bytes and stored tail.
RING = Layout("RingControl", (
    ("head", "Q"),
    ("busy", "I"),          # a writer holds the ring (a program interrupted by another point's on this CPU)
    ("", "4x"),
    ("bell", "I"),
    ("", "4x"),
    ("sec_ns", "Q"),         # the program's: the wall-clock second its last pcap timestamp fell in, in ns ...
    ("sec", "Q"),            # ... and in seconds (ts_sec without a division while the second lasts)
    ("last", "Q"),           # the timestamp of the last record published ...
    ("disorder", "Q"),       # ... and how many were older than the one before (fcap.live.order merges those by record)
    ("next_id", "Q"),        # the program's: the packet ids it takes while holding the ring (fcap.kernel.track.in_ring)
    ("tail", "Q"),           # user space's: on its own cache line
    ("taken", "Q"),          # user space's: records taken so far (count bits as head's): frees the index's entries
    ("", "48x"),
))
RING_CTRL = RING.size
assert RING_CTRL == 128 and RING.off("tail") == 64
HEAD_BITS = 40
HEAD_POS = (1 << HEAD_BITS) - 1
HEAD_ONE = 1 << HEAD_BITS
HEAD_COUNT = (1 << (64 - HEAD_BITS)) - 1   # the count bits of head, shifted down
# After the ring's slack, each CPU's index of its records: one entry per record, at (its count & (entries - 1)),
# written before the record is published: its timestamp and the position where it ends (as head's position bits).
# User space merges the CPUs' records by these (fcap.live.order) and frees the entries by storing `taken`; the program
# refuses a record (lost) while the index is full. One entry per RING_INDEX_BYTES bytes of ring.
RING_INDEX = Layout("RingIndex", (("ts", "Q"), ("end", "Q")))
RING_INDEX_BYTES = 32
RING_MAX = 64 << 20      # per CPU (kernels before 6.x cap a map value at 4 MiB: then 2 MiB, see Session)

# ---- the pcapng comment --------------------------------------------------------------------------------------------
# (text before, Record attribute, style) of each field's attribute with a key (fcap.kernel.record), in META's order but
# for the length, last. The capture program formats it into the file rings (fcap.kernel.ringrec): the first (the skb)
# and the last (the length) every packet, the middle once per change of the META fields it shows; user space formats
# the same text for the records it lays out itself (format_comment).
_KEYED = [(a.key, a.name, a.style) for f in record.FIELDS for a in f.attrs if a.key]
COMMENT = tuple([k for k in _KEYED if k[1] != "len"] + [k for k in _KEYED if k[1] == "len"])
assert COMMENT[0][1] == "skb" and COMMENT[-1][1] == "len", "fcap.kernel.kcomment writes these every packet"
READ = {a.name: (f.name, a.read) for f in record.FIELDS + record.FILE_HEADER for a in f.attrs}   # attr -> (field, how)
COMMENT_SOURCE = {attr: READ[attr][0] for _pre, attr, _s in COMMENT}   # Record attribute -> META field
_STYLE = {"dec": "%d", "hex": "%x", "hex4": "%04x", "hex16": "%016x", "str": "%s"}   # style -> printf's conversion
# (the whole comment as one printf format over the attributes in order: a record's text in two C calls, ~1 us, where
# user space lays out each block)
_COMMENT_FORMAT = "".join(pre.replace("%", "%%") + _STYLE[style] for pre, _attr, style in COMMENT)
_COMMENT_VALUES = operator.attrgetter(*(attr for _pre, attr, _style in COMMENT))


def format_comment(rec) -> str:
    """The comment's text of a Record (its COMMENT attributes, integers and comm's str)."""
    return _COMMENT_FORMAT % _COMMENT_VALUES(rec)


def _widest(attr: str, style: str) -> int:
    """The most characters a value of the attribute takes in its style (as the program writes it)."""
    size = META.width(COMMENT_SOURCE[attr])
    read = READ[attr][1]
    size = 4 if read in ("hi32", "lo32") else 2 if read == "be16" else size
    return {"dec": len(str(256 ** size - 1)), "hex": 2 * size, "hex4": 4, "hex16": 16}.get(style, size)


# Its area at the end of the scratch value: the META bytes the middle was made from (packed as in META), whether
# they are valid, the middle's length, the last packet's skb high half and length with their text, and the text
# (written at positions masked to TEXT_POS_MASK, and up to 16 bytes past them).
COMMENT_KEY = tuple(dict.fromkeys(COMMENT_SOURCE[attr] for _pre, attr, _s in COMMENT[1:-1]))
KEY_WORDS = META.words(COMMENT_KEY)
TEXT_POS_MASK = 255
MID_MAX = sum(len(pre) + _widest(attr, style) for pre, attr, style in COMMENT[1:-1])
# "skb=0x" + 16 + the middle + " len=" + 10, rounded up to 8: the bytes the program copies
TEXT_MAX = len(COMMENT[0][0]) + 16 + MID_MAX + len(COMMENT[-1][0]) + 10 + 7 & ~7
assert TEXT_MAX + 16 <= TEXT_POS_MASK + 1, "the comment's text is written at positions masked to TEXT_POS_MASK"
CAREA = Layout("CommentArea", (
    ("key", f"{sum(n for _o, n in KEY_WORDS)}s"),
    ("valid", "B"),
    ("", f"{-(sum(n for _o, n in KEY_WORDS) + 1) % 8}x"),
    ("midlen", "I"),
    ("", "4x"),
    # the per-packet parts remembered from the last packet: the skb address's high half and its 8 hex digits (a
    # kernel address's high half is never 0, so the zeroed area never matches); the length + 1 (0: none yet), its
    # text's length and the text itself (" len=" and the digits)
    ("skb_hi", "I"),
    ("len_key", "I"),
    ("skb_hi_hex", "Q"),
    ("len_n", "I"),
    ("", "4x"),
    ("len_text", "16s"),
    ("text", f"{TEXT_POS_MASK + 1 + 16}s"),
))
# --context into the file rings: the names user space gave a (cgroup, netns), which the program copies after the
# comment's text (fcap.kernel.ringrec; a hash map's key and value, filled by fcap.features.packet_context). `expires`:
# CLOCK_MONOTONIC ns after which the program asks again (names found later: a namespace named since). Only read by
# the programs: the CPUs share its cache lines.
CTX_MAX = 248
CTX_KEY = Layout("ContextKey", (("cgroup", "Q"), ("netns", "Q")))
CTX_TEXT = Layout("ContextText", (("len", "Q"), ("expires", "Q"), ("text", f"{CTX_MAX}s")))
# --stack into the file rings: the comment's text of a stack id, which user space gives the programs when it first
# reads that id (fcap.kernel.kstack: an id's frames never change) and they copy after the metadata's (and
# --context's) text (fcap.kernel.ringrec). A longer text: the perf buffer, every time.
STK_MAX = 2040
STK_KEY = Layout("StackKey", (("id", "I"),))
STK_TEXT = Layout("StackText", (("len", "Q"), ("text", f"{STK_MAX}s")))
# ... and a drop's names, the same way: the text of a (reason, location) at a point with a reason (`named`: 1) or
# without one (0), given once (fcap.features.drop_reason)
DROP_MAX = 248
DROP_TEXT_KEY = Layout("DropTextKey", (("reason", "I"), ("named", "I"), ("location", "Q")))
DROP_TEXT = Layout("DropText", (("len", "Q"), ("text", f"{DROP_MAX}s")))
# --nft: what the trace socket's program (fcap.kernel.nftfilter) leaves on each CPU for the capture program
# (fcap.kernel.nftverdict), one PERCPU_ARRAY value. nf_tables sends its trace events from the packet's own path, so
# a drop's verdict reaches the socket's program on the CPU that then frees the packet, just before the drop point:
# `cur_*` the first header bytes of the last event that carried them (its trace id; NFT_HDR bytes at most, zeros
# after), `drop_*` those of the last drop verdict and its rule's key (NFT_TEXT_KEY), which the drop point takes
# (drop_len 0) when the freed packet's network header begins with them; `unmatched` counts the netfilter drops that
# found none (where the kernel has drop reasons). `attrs`: the socket's program's own, where
# each event's attributes are (offset | nla_len << 32 by type, NFT_ATTRS types), and `pending`, the NFT_TEXT it
# puts in the texts map under a key it lets through to user space (len NFT_PENDING), so that it lets through one
# event per key.
NFT_HDR = 32
NFT_ATTRS = 17
NFT_MAX = 1016
NFT_PENDING = NFT_MAX + 1
NFT_TEXT_KEY = Layout("NftTextKey", (("rule", "Q"),))
NFT_TEXT = Layout("NftText", (("len", "Q"), ("text", f"{NFT_MAX}s")))
NFT_SLOT = Layout("NftSlot", (("cur_id", "I"), ("cur_len", "I"), ("cur_hdr", f"{NFT_HDR}s"), ("drop_len", "I"),
                              ("", "4x"), ("drop_rule", "Q"), ("drop_hdr", f"{NFT_HDR}s"),
                              ("unmatched", "Q"), ("attrs", f"{8 * NFT_ATTRS}s"), ("pending", f"{NFT_TEXT.size}s")))
# ... and the comment's text of each rule key (` nft_family=inet nft_table=...`), given by user space once it has
# named the key (fcap.features.nft_rule): the socket's program lets through only the drop verdicts of keys without a
# text, so that user space parses one event per rule; the file rings' programs copy the text as a drop's names.
# Key 0 (no rule) has the empty text.
TEXT_SKB = len(COMMENT[0][0])             # the skb's 16 hex digits start here
TEXT_MID = TEXT_SKB + 16                  # then the middle
assert CAREA.off("text") % 8 == 0


# ---- user space: a record read back by name ---------------------------------------------------------------------
# A capture record as user space reads it back: the attributes of META's fields (fcap.kernel.record), then the
# captured bytes from the linktype's start, --dump's fcap.kernel.dumps.Dump per PATH, and --stack's frames (innermost
# first, () unknown: fcap.kernel.kstack; None without --stack).
Record = namedtuple("Record", [a for a in READ] + ["data", "dumps", "stack"], defaults=((), None))


def _parser():
    """parse_record's body, made once from the fields' READS (as namedtuple makes its class): one unpack and one
    expression per attribute, as a hand-written parser would do it."""
    values = ", ".join(record.READS[how].format(v=f"m.{field}") for field, how in READ.values())   # (Record's order)
    src = ("def parse_record(raw):\n"
           "    m = unpack(raw)\n"
           "    body = META_SIZE + m.hdr\n"
           "    if m.fast:\n"
           "        data = bytes(raw[META_SIZE:META_SIZE + m.fast])\n"
           "    else:\n"
           "        data = bytes(raw[META_SIZE:body]) + bytes(raw[body + m.skip:body + m.copy])\n"
           f"    return new(Record, ({values}, data, (), None))\n")
    scope = {"unpack": META.unpack, "META_SIZE": META_SIZE, "FLAG_QUEUE": FLAG_QUEUE, "Record": Record,
             "new": tuple.__new__}   # (positional: a namedtuple's keywords cost ~1 us a record more)
    exec(src, scope)   # noqa: S102 - the source is made above from the declarations, nothing from outside
    fn = scope["parse_record"]
    fn.__doc__ = "A perf sample's bytes (META, header bytes, skb bytes) as a Record."
    return fn


parse_record = _parser()
