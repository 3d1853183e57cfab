"""`fcap -r FILE --json` a batch at a time (fcap.files.batches), as fcap.text.fastlines makes -r's printed lines:
the frames fcap.text.dissect.common.ether_json writes in one pass (Ethernet, IPv4 not a later fragment or IPv6 with
no extension header, carrying a TCP header captured whole, UDP ports or an ICMP/ICMPv6 type and code) laid out with
one %-format over the batch (each flow's text made once, by ether_json's own _json_flow); every other packet's line
fcap.text.jsonout's, in its place. A pcap file's packets have no metadata: each line is the lengths, then the
headers, the same text as packet by packet."""

from __future__ import annotations

from fcap.defaults import FILE_BATCH
from fcap.files.pcapread import FileRecord
from fcap.live.fastmerge import np
from fcap.text.dissect import common
from fcap.text.fastflows import ids
from fcap.text.fastlines import first_bytes
from fcap.text.printer import formatted_rows

_HEAD = '{"ts_ns":%d,"len":%d,"caplen":%d,"linktype":1,'
_TCP_TAILS = tuple(flags.replace("%", "%%") + ',"seq":%d,"ack":%d,"win":%d}}\n' for flags in common._FLAG_JSON)
_KEY4 = np.array([*range(15), 22, 23, *range(26, 34)])   # ether_json's flow key: MACs, type, version and header
_KEY6 = np.array([*range(14), *range(20, 54)])           # length (v4), TTL and protocol, the addresses


def batch_json(fields, b, data: bytes, slow, head=None) -> list:
    """The JSON lines of one pcap batch, each ending in a newline (fcap.text.printer.formatted_rows' pieces: ASCII
    bytes, or str where a line is not ASCII; fcap.text.printer.write_lines writes them); slow(i): jsonout's line of
    packet i. `head`: each row's text up to its headers' (ending in '"linktype":1,'), as (per row its %-format, its
    values, which of them it takes: arrays of n, n × k and n × k); None: a file's packet's (its time and
    lengths)."""
    at = fields["at"]
    n = len(at)
    top = len(b) - 1

    def u8(o):
        return b[np.minimum(at + o, top)].astype(np.int64)

    def u16(o):
        return u8(o) << 8 | u8(o + 1)

    cap = fields["caplen"].astype(np.int64)
    etype, vhl = u16(12), u8(14)
    hlen, total, plen = (vhl & 15) * 4, u16(16), u16(18)
    v4 = (etype == 0x0800) & (vhl >> 4 == 4) & (hlen >= 20) & (total >= hlen) & (u16(20) & 0x1FFF == 0) \
        & (np.minimum(cap, 14 + total) - 14 >= hlen)
    v6 = (etype == 0x86DD) & (cap >= 54) & (vhl >> 4 == 6) & (plen > 0)
    ok = (fields["linktype"] == 1) & (cap >= 34) & (cap <= fields["len"]) & (v4 | v6)
    proto = np.where(v4, u8(23), u8(20))
    off = np.where(v4, 14 + hlen, 54)
    end = np.minimum(cap, np.where(v4, 14 + total, 54 + plen))
    tcp = ok & (proto == 6) & (off + 20 <= end)
    ports = tcp | ok & (proto == 17) & (off + 4 <= end)
    typed = ok & ((proto == 1) & v4 | (proto == 58) & v6) & (off + 2 <= end)
    fast = ports | typed
    flow, texts = _flows(b, data, at, off, v4, fast, ports, etype, proto)
    t = at + off

    def t8(o):
        return b[np.minimum(t + o, top)].astype(np.int64)

    def t32(o):
        return t8(o) << 24 | t8(o + 1) << 16 | t8(o + 2) << 8 | t8(o + 3)

    formats, front, taken = head if head is not None else \
        (_HEAD, np.column_stack((fields["ts_ns"], fields["len"], cap)), np.ones((n, 3), bool))
    parts = np.empty((n, 3), object)
    parts[:, 0] = formats
    parts[:, 1] = np.array(texts, object)[flow]
    parts[:, 2] = np.where(tcp, np.array(_TCP_TAILS, object)[t8(13)], "}\n")
    values = np.column_stack((front, *(v.astype(front.dtype) for v in (np.where(v4, total, plen + 40), t32(4), t32(8),
                                                                       t8(14) << 8 | t8(15)))))
    count = np.where(tcp, 4, 1)
    arp = (fields["linktype"] == 1) & (etype == 0x0806) & (cap >= 42) & (cap <= fields["len"]) & (u16(14) != 19) \
        & (u16(16) == 0x0800) & (u16(18) == 0x0604)
    parts[arp, 1], parts[arp, 2], count[arp] = _arp_texts(b, at[arp], np.flatnonzero(arp), slow), "", 0
    for i in np.flatnonzero(~fast & ~arp).tolist():
        parts[i] = (slow(i).replace("%", "%%"), "", "")
        count[i] = 0
        taken[i] = False
    taken = np.column_stack((taken, np.arange(4) < count[:, None]))
    counts = taken.sum(axis=1)
    return formatted_rows(parts, values[taken], np.cumsum(counts) - counts)


def _flows(b, data: bytes, at, off, v4, fast, ports, etype, proto) -> tuple:
    """Each fast row's flow number and each flow's template: ether_json's text around the IP length's %d."""
    top = len(b) - 1
    head = first_bytes(b, at, 54)
    key = np.zeros((len(at), 56), np.uint8)
    key[:, 0] = np.where(v4, 4, 6) * fast
    key[:, 1:26] = np.where(v4[:, None], head[:, _KEY4], 0)
    key[:, 1:49] |= np.where(v4[:, None], 0, head[:, _KEY6])
    size = np.where(ports, 4, 2)
    for k in range(4):
        key[:, 49 + k] = np.where(k < size, b[np.minimum(at + off + k, top)], 0)
    key[~fast] = 0
    flow, first = ids(key.view(">u8").astype(np.uint64))
    texts = []
    for row in first.tolist():
        if not fast[row]:
            texts.append("")
            continue
        a, o, four = int(at[row]), int(off[row]), bool(v4[row])
        raw = data[a:a + o + 4]
        head = raw[0:15] + raw[22:24] + raw[26:34] if four else raw[0:14] + raw[20:54]
        flow_key = head + raw[o:o + int(size[row])]
        before, after = common._json_flows.get(flow_key) or common._json_flow(flow_key, raw, int(etype[row]),
                                                                               int(proto[row]), o)
        texts.append(before.replace("%", "%%") + "%d" + after.replace("%", "%%"))
    return flow, texts


def _arp_texts(b, at, rows, slow):
    """The ARP rows' texts after the lengths (IPv4 over a link with 6-byte addresses, fcap.text.dissect.link._arp's
    layer): jsonout's line of a row with the same first 42 bytes (its MACs, operation and addresses), made once."""
    if not len(rows):
        return np.empty(0, object)
    key = first_bytes(b, at, 48).view(">u8").astype(np.uint64)
    key[:, 5] &= np.uint64(0xFFFF << 48)   # (the first 42 bytes)
    number, first = ids(key)
    texts = []
    for row in rows[first].tolist():
        line = slow(row)
        texts.append(line[line.index(_LINKTYPE) + len(_LINKTYPE):].replace("%", "%%"))
    return np.array(texts, object)[number]


_LINKTYPE = '"linktype":1,'


def json_pcap(path: str, out, line, limit: int = 0) -> tuple[int, bool]:
    """-r FILE --json of a pcap file a batch at a time into `out`, as fcap.text.fastfile.print_pcap prints lines:
    (packets written, whether that was the whole file or the limit). line(rec): the line of a record read from a
    file (a fcap.files.pcapread.FileRecord), for those the batch does not lay out (JsonSink.file_line)."""
    from fcap.errors import PcapFormatError
    from fcap.files import batches
    from fcap.text.printer import write_lines
    with open(path, "rb") as f:
        if not isinstance(batches._format(f.read(24)), tuple):
            return 0, False
    written = 0
    try:
        for batch in batches.batches(path, FILE_BATCH, decoded=False):
            fields = batch.fields if not limit else batch.fields[:limit - written]
            data = batch.data.base if isinstance(batch.data.base, bytes) else batch.data.tobytes()

            def slow(i: int, fields=fields, data=data) -> str:
                a = int(fields["at"][i])
                return line(FileRecord(int(fields["ts_ns"][i]), data[a:a + int(fields["caplen"][i])],
                                       int(fields["len"][i]), int(fields["linktype"][i])))

            write_lines(out, batch_json(fields, batch.data, data, slow))
            written += len(fields)
            if written == limit:
                break
    except PcapFormatError:
        return written, False
    return written, True
