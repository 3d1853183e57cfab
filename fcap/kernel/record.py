"""The capture record's fields, each declared once: its bytes in the metadata the program writes ahead of each
packet (fcap.kernel.layout's META, laid out from this list), the skb member the program copies into it, and the
Record attributes user space reads from it, with their keys in the metadata comment and whether fcap.Packet (so
--json and the API) has them. META's layout, the record parser, the comment's text (the program's and user
space's), Packet's metadata attributes and Wireshark's fields are made from FIELDS; a new field is a line here
(README's "How it is built": a field)."""

from __future__ import annotations

from typing import NamedTuple


class Attr(NamedTuple):
    """A Record attribute made of a field's value: `read` says how (READS), `key` is its text before the value in
    the metadata comment ("" none) and `style` how the value is written there (fcap.features.comments.STYLES);
    `packet`: fcap.Packet has it too (so --json and the API), None where the record has no value for it."""

    name: str
    read: str = ""
    key: str = ""
    style: str = ""
    packet: bool = False
    doc: str = ""


class Field(NamedTuple):
    """Bytes of META: its name (the program's), struct format and meaning; `skb`: the sk_buff member the program
    copies into it with the record's metadata (pcapng with comments; 0 at XDP); `attrs`: what user space reads from
    it."""

    name: str
    fmt: str
    doc: str
    attrs: tuple = ()
    skb: str = ""


# How an attribute is read from its field's value v (m: the whole META tuple), as Python (fcap.kernel.layout compiles
# the parser from these) and as the program loads it for the comment (fcap.kernel.kcomment).
READS = {
    "": "{v}",
    "hi32": "{v} >> 32",
    "lo32": "{v} & 0xFFFFFFFF",
    "cstr": "{v}.split(b'\\0', 1)[0].decode(errors='replace')",
    "be16": "({v} >> 8 | ({v} & 0xFF) << 8)",
    "s32": "(({v} & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000",
    "queue": "({v} if m.flags & FLAG_QUEUE else None)",
}


def _a(name: str, key: str = "", style: str = "", read: str = "", packet: bool = False, doc: str = "") -> Attr:
    return Attr(name, read, key, style, packet, doc)


# In META's order. The comment shows the attributes with a key in this order, but for the first (skb) and the
# last (len), which the program writes on every packet (fcap.kernel.kcomment): the rest, its middle, is cached per
# change of the fields it shows, which must lie in the bytes from skb to fast (the perf drain caches the blocks'
# options by those bytes, fcap.live.drain); fcap.kernel.layout refuses a layout that breaks it.
FIELDS = (
    Field("ts", "Q", "monotonic ns (ktime_get_ns)", (_a("ts_ns"),)),
    Field("id", "Q", "the packet id (pcapng epb_packetid): fcap.kernel.track", (_a("id"),)),
    Field("skb", "Q", "the skb's address", (
        _a("skb", "skb=0x", "hex16", packet=True,
           doc="the skb's address (the same skb at several points: one packet followed)"),)),
    Field("pidtgid", "Q", "tgid << 32 | pid of the task the program ran in", (
        _a("pid", " pid=", "dec", "hi32", True, "thread group id of the task the point ran in"),
        _a("tid", " tid=", "dec", "lo32", True, "its thread id"))),
    Field("location", "Q", "drop points: where the skb was freed (the tracepoint's location argument)",
          (_a("location"),)),
    Field("cgroup", "Q", "--context: the cgroup id of the skb's socket, else of the task (fcap.kernel.context)", (
        _a("cgroup", packet=True, doc="--context: the cgroup id of the packet's socket, else of the task"),)),
    Field("verdict", "Q", "at a BPF program's exit: its return value (fcap.kernel.verdicts)",
          (_a("retval", read="s32"),)),
    Field("nft", "Q", "--nft at drop points: the key of the nftables rule (or policy) that dropped the packet, as "
          "the trace socket's program made it (fcap.kernel.nftfilter); 0: none", (_a("nft_key"),)),
    Field("dumps", "Q", "--dump into the file rings: a hash of the record's dumps, the key of their pcapng options "
          "user space gives the programs (fcap.kernel.dumps)", (_a("dump_key"),)),
    Field("comm", "16s", "the task's name", (_a("comm", " comm=", "str", "cstr", True, "the task's name"),)),
    Field("len", "I", "skb->len", (_a("len", " len=", "dec"),)),
    Field("copy", "I", "bytes handed to the perf sample from the skb (from offset skip)"),
    Field("ifindex", "I", "the device's index", (
        _a("ifindex", " ifindex=", "dec", packet=True, doc="the device's index"),)),
    Field("mark", "I", "skb->mark", (_a("mark", " mark=0x", "hex", packet=True, doc="skb->mark"),), skb="mark"),
    Field("priority", "I", "skb->priority", (_a("priority", " priority=", "dec", packet=True,
                                                 doc="skb->priority: SO_PRIORITY's, or a tc class"),), skb="priority"),
    Field("netns", "I", "the device's network namespace inode number", (
        _a("netns", " netns=", "dec", packet=True, doc="the device's network namespace inode number"),)),
    Field("reason", "I", "drop points: enum skb_drop_reason", (_a("reason"),)),
    Field("proto", "H", "skb->protocol, network order", (_a("protocol", " proto=0x", "hex4", "be16"),)),
    Field("hdr", "H", "made-up link header + header bytes before skb->data, in the scratch after META"),
    Field("skip", "H", "skb bytes before the linktype's start (the start lies past skb->data)"),
    Field("pkt_type", "B", "skb->pkt_type (PACKET_OUTGOING at points that see packets leave)",
          (_a("pkt_type", " pkt_type=", "dec"),)),
    Field("flags", "B", "FLAG_* (fcap.kernel.layout)", (_a("flags"),)),
    Field("point", "H", "the point's id (the pcapng interface)", (_a("point"),)),
    Field("hatype", "H", "the device's ARPHRD type", (_a("hatype"),)),
    Field("queue", "H", "FLAG_QUEUE: the device queue the packet was given (transmit) or came from (receive)", (
        _a("queue", read="queue", packet=True, doc="the device queue at device-layer points (epb_queue)"),)),
    Field("stack", "H", "--stack: the kernel stack's id in the stack map (fcap.kernel.kstack), STACK_NONE: none"),
    Field("fast", "I", "caplen when the record's bytes are contiguous, else 0 (user space assembles them)"),
)

# META ends with the capture file's own record header, laid out by the program so that, when the skb's bytes follow
# the link header bytes without a gap (skip == 0), user space writes the sample's tail as it is:
#   pcap:   ts1 ts2 caplen orig                          (ts_sec ts_nsec caplen len: the last 16 bytes)
#   pcapng: btype total iface ts1 ts2 caplen orig        (an EPB's header without options: the last 28 bytes)
FILE_HEADER = (
    Field("btype", "I", "pcapng: the block type"),
    Field("total", "I", "pcapng: the block's length"),
    Field("iface", "I", "pcapng: the interface (the point)"),
    Field("ts1", "I", "pcap: seconds; pcapng: the timestamp's high half"),
    Field("ts2", "I", "pcap: nanoseconds; pcapng: the timestamp's low half"),
    Field("caplen", "I", "the bytes captured"),
    Field("orig", "I", "the packet's length from the linktype's start", (_a("orig_len"),)),
)
