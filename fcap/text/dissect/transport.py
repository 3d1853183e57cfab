"""TCP (flags, relative sequence numbers, options) and UDP, as tcpdump -nn prints them."""

from __future__ import annotations

from typing import NamedTuple

from fcap.text.dissect.cksum import shouldbe, transport_cksum
from fcap.text.dissect.mptcp import mptcp_option
from fcap.text.dissect.reader import M32, PrintState, Truncated

# Names as tcpdump 4.99 prints them.
_TCP_FLAGS = ((0x01, "F"), (0x02, "S"), (0x04, "R"), (0x08, "P"), (0x10, "."), (0x20, "U"), (0x40, "E"), (0x80, "W"))
_TCP_OPTS = {0: "eol", 1: "nop", 2: "mss", 3: "wscale", 4: "sackOK", 5: "sack", 6: "echo", 7: "echoreply", 8: "TS",
             11: "cc", 12: "ccnew", 13: "", 19: "md5", 20: "scps", 28: "uto", 29: "tcp-ao", 30: "mptcp", 34: "tfo",
             254: "exp"}
_EOL, _NOP = 0, 1
TCP_FLAG_NAMES = ("FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR")   # (--json's, by bit)
# Data bytes of the options tcpdump reads with a fixed size; any other option's length field counts its data.
_TCP_OPT_DATALEN = {0: 0, 1: 0, 4: 0, 2: 2, 3: 1, 6: 4, 7: 4, 11: 4, 12: 4, 13: 4, 8: 8, 19: 16, 20: 2, 28: 2}
_TFO_MAGIC = 0xF989


def addresses(p: PrintState, ip_off: int, ver: int) -> tuple[str, str, bytes, bytes, int]:
    """Source, destination (as text and bytes) and the first next-header field of the IP header at ip_off."""
    if ver == 4:
        return (p.ip4(ip_off + 12), p.ip4(ip_off + 16), p.b[ip_off + 12:ip_off + 16], p.b[ip_off + 16:ip_off + 20],
                p.b[ip_off + 9])
    return p.ip6(ip_off + 8), p.ip6(ip_off + 24), p.b[ip_off + 8:ip_off + 24], p.b[ip_off + 24:ip_off + 40], \
        p.b[ip_off + 6]


# ------------------------------------------------------------------------------------------ TCP


def conversation(srcb: bytes, dstb: bytes, sport: int, dport: int) -> tuple[tuple, bool]:
    """A TCP segment's key in the table of relative sequence numbers (either direction the same) and whether it
    goes the reverse way (the greater port, or address, first), as tcpdump keys its table."""
    rev = sport > dport or (sport == dport and srcb > dstb)
    return ((dstb, srcb, dport << 16 | sport) if rev else (srcb, dstb, sport << 16 | dport)), rev


def relative(seqs: dict, key: tuple, rev: bool, seq: int, ack: int, flags: int) -> tuple[int, int, tuple]:
    """tcpdump's relative sequence numbers of a segment with an ACK: (seq, ack, the conversation's base). A SYN,
    or the first segment seen, sets the base and keeps its own numbers."""
    base = seqs.get(key)
    if base is None or flags & 0x02:
        seqs[key] = base = ((ack - 1) & M32, seq) if rev else (seq, (ack - 1) & M32)
        return seq, ack, base
    if rev:
        return (seq - base[1]) & M32, (ack - base[0]) & M32, base
    return (seq - base[0]) & M32, (ack - base[1]) & M32, base

def tcp(p: PrintState, off: int, length: int, ip_off: int, ver: int, fragmented: int = 0) -> None:
    p.proto = "tcp"
    src, dst, srcb, dstb, first_nh = addresses(p, ip_off, ver)
    if off + 4 > p.end:
        p.add(f"{src} > {dst}:")
        raise Truncated(soft=True)
    sport, dport = p.u16(off), p.u16(off + 2)
    layer = p.layer("tcp", sport=sport, dport=dport)
    p.add(f"{src}.{sport} > {dst}.{dport}: " if first_nh == 6 else f"{sport} > {dport}: ")
    p.need(off, 20, soft=True)
    hlen = (p.b[off + 12] >> 4) * 4
    seq, ack, flags, win, urp = p.u32(off + 4), p.u32(off + 8), p.b[off + 13], p.u16(off + 14), p.u16(off + 18)
    layer.update(flags=[n for i, n in enumerate(TCP_FLAG_NAMES) if flags >> i & 1], seq=seq, ack=ack, win=win)
    if hlen < 20:
        p.add(f" tcp {(length - hlen) & M32} [bad hdr length {hlen} - too short, < 20]")
        return
    p.add("Flags [%s]" % ("".join(c for bit, c in _TCP_FLAGS if flags & bit) or "none"))
    rev, thseq, thack = False, 0, 0
    if p.seqs is not None and flags & 0x10:  # tcpdump's relative sequence numbers, one entry per conversation
        key, rev = conversation(srcb, dstb, sport, dport)
        seq, ack, (thseq, thack) = relative(p.seqs, key, rev, seq, ack, flags)
    if hlen > length:
        p.add(f" [bad hdr length {hlen} - too long, > {length}]")
        return
    if p.checks and not fragmented and off + length <= p.end:
        field, computed = p.u16(off + 16), transport_cksum(p, ip_off, ver, off, length, 6)
        p.add(f", cksum 0x{field:04x} " + (f"(incorrect -> 0x{shouldbe(field, computed):04x})" if computed
                                            else "(correct)"))
    length -= hlen
    if length > 0 or flags & 0x07 or p.verbose > 1:
        p.add(f", seq {seq}" + (f":{(seq + length) & M32}" if length > 0 else ""))
    p.add((f", ack {ack}" if flags & 0x10 else "") + f", win {win}" + (f", urg {urp}" if flags & 0x20 else ""))
    if hlen > 20:
        p.add(", options [")
        if not _tcp_options(p, off + 20, hlen - 20, _Segment(thseq if rev else thack, flags, off + hlen + length)):
            return
        p.add("]")
    p.add(f", length {length}")
    if length == 0:
        return
    if p.end - off < hlen:
        p.add(f" [remaining caplen({max(p.end - off, 0)}) < header length({hlen})]")
        raise Truncated
    if flags & 0x04 and p.verbose:
        _rst_data(p, off + hlen, length)
    # (tcpdump goes on to decode the payload of well-known ports: HTTP, BGP, DNS...; not copied here)


def _rst_data(p: PrintState, off: int, length: int) -> None:
    """tcpdump -v's text of a reset's data ("[RST reason]"; "+" past 30 bytes, "!" when not all captured)."""
    text = [" [RST" if off + length <= p.end else " [!RST"]
    if length > 30:
        length = 30
        text.append("+")
    text.append(" ")
    for c in p.b[off:min(off + length, p.end)]:
        text.append(("M-" if c > 0x7F else "") + ("^" + chr((c & 0x7F) ^ 0x40) if not 0x20 <= c & 0x7F < 0x7F
                                                   else chr(c & 0x7F)))
    p.add("".join(text) + "]")


class _BadOpt(Exception):
    """A TCP option longer than the options area."""


class _Segment(NamedTuple):
    """What a TCP option's printer needs of its segment: the base of relative SACK numbers, the TCP flags, and
    where the segment's payload ends (past the capture: an MD5 signature cannot be checked)."""

    sack_base: int
    flags: int
    payload_end: int


class _Opt:
    """One TCP option's data being printed: where it starts, its size, what is left of the options area."""

    __slots__ = ("p", "kind", "at", "size", "left", "later", "seg")

    def __init__(self, p: PrintState, kind: int, at: int, size: int, left: int, later: bool, seg: _Segment) -> None:
        self.p, self.kind, self.at, self.size, self.left, self.later, self.seg = p, kind, at, size, left, later, seg

    def check(self, n: int) -> None:
        """tcpdump's LENCHECK: past the option is bad, past the capture truncated."""
        if n > self.left:
            raise _BadOpt
        if self.at + n > self.p.end:
            raise Truncated(">" if self.later else "", soft=True)


def _opt_none(o: _Opt) -> None:
    pass


def _opt_sack(o: _Opt) -> None:
    p, at = o.p, o.at
    if o.size % 8:
        p.add(" invalid sack")
        return
    p.add(f" {o.size // 8} ")
    for i in range(0, o.size, 8):
        o.check(i + 4)
        start = p.u32(at + i)
        o.check(i + 8)
        p.add(f"{{{(start - o.seg.sack_base) & M32}:{(p.u32(at + i + 4) - o.seg.sack_base) & M32}}}")


def _opt_fastopen(o: _Opt) -> None:
    """TCP Fast Open (34), or experimental (254, RFC 6994: Fast Open's magic, AccECN's...)."""
    p, at, size = o.p, o.at, o.size
    o.check(size)
    if o.kind == 254:
        if size < 2:
            raise _BadOpt
        magic, at, size = p.u16(at), at + 2, size - 2
        p.add("-tfo" if magic == _TFO_MAGIC else f"-{magic:04x}")
        if magic != _TFO_MAGIC:
            return
    else:
        p.add(" ")
    p.add(" cookiereq" if size == 0 else " (invalid)" if size % 2 or not 4 <= size <= 16
          else " cookie " + p.b[at:at + size].hex())


def _opt_number(o: _Opt) -> None:
    o.check(o.size)
    value = int.from_bytes(o.p.b[o.at:o.at + o.size], "big")
    o.p.add(f" val {value >> 32} ecr {value & M32}" if o.kind == 8 else f" {value}")


def _opt_md5(o: _Opt) -> None:
    """TCP-MD5 (RFC 2385): tcpdump built with libcrypto can check it only with -M SECRET, which fcap has not."""
    o.check(o.size)
    why = "snaplen too short" if o.seg.payload_end > o.p.end else "shared secret not supplied with -M"
    o.p.add(f" {why}, can't check - " + o.p.b[o.at:o.at + o.size].hex())


def _opt_scps(o: _Opt) -> None:
    o.check(o.size)
    o.p.add(f" cap {o.p.b[o.at]:02x} id {o.p.b[o.at + 1]}")


def _opt_uto(o: _Opt) -> None:
    """User timeout (RFC 5482): the field in hex, then the timeout in seconds (the low bit: it counts minutes)."""
    o.check(o.size)
    value = o.p.u16(o.at)
    o.p.add(f" 0x{value:x} {(value >> 1) * 60 if value & 1 else value >> 1}")


def _opt_tcp_ao(o: _Opt) -> None:
    """TCP-AO (RFC 5925): key id, receive-next key id, the MAC."""
    p = o.p
    if o.size < 2:
        p.add(" (invalid)")
        return
    o.check(1)
    p.add(f" keyid {p.b[o.at]}")
    o.check(2)
    p.add(f" rnextkeyid {p.b[o.at + 1]}")
    if o.size > 2:
        p.add(" mac 0x")
        for i in range(2, o.size):
            o.check(i + 1)
            p.add(f"{p.b[o.at + i]:02x}")


def _opt_mptcp(o: _Opt) -> None:
    """MPTCP (fcap.text.dissect.mptcp), read no further than the option, as tcpdump."""
    o.check(o.size)
    p, end = o.p, o.p.end
    p.proto = "mptcp"   # (tcpdump's name for a truncation from here on, in this option or a later one)
    p.end = min(end, o.at + o.size)
    try:
        ok = mptcp_option(p, o.at - 2, o.size + 2, o.seg.flags)
    finally:
        p.end = end
    if not ok:
        raise _BadOpt


def _opt_bytes(o: _Opt) -> None:
    """An option tcpdump has no printer for: its bytes in hex."""
    o.p.add(" 0x" if o.size else "")
    for i in range(o.size):
        o.check(i + 1)
        o.p.add(f"{o.p.b[o.at + i]:02x}")


_OPT_PRINTERS = {0: _opt_none, 1: _opt_none, 4: _opt_none, 5: _opt_sack, 19: _opt_md5, 20: _opt_scps, 28: _opt_uto,
                 29: _opt_tcp_ao, 30: _opt_mptcp, 34: _opt_fastopen, 254: _opt_fastopen,
                 **dict.fromkeys((2, 3, 6, 7, 8, 11, 12, 13), _opt_number)}


def _tcp_options(p: PrintState, cp: int, hl: int, seg: _Segment) -> bool:
    """tcpdump's option list; False when it stopped at a bad option (it then prints no length)."""
    later = False
    while hl > 0:
        p.add("," if later else "")
        kind = p.u8(cp)
        head = 1 if kind in (_EOL, _NOP) else 2  # kind, and length unless a one-byte option
        ln = 1 if head == 1 else p.u8(cp + 1)
        cp += head
        if head == 2 and (ln < 2 or ln > hl):
            p.add("[bad opt]" + ("]" if later else ""))
            return False
        hl -= head
        p.add(_TCP_OPTS.get(kind, f"unknown-{kind}"))
        size = _TCP_OPT_DATALEN.get(kind, ln - 2)
        try:
            _OPT_PRINTERS.get(kind, _opt_bytes)(_Opt(p, kind, cp, size, hl, later, seg))
        except _BadOpt:
            p.add("[bad opt]" + ("]" if later else ""))
            return False
        cp, hl = cp + size, hl - size
        if size + head != ln:
            p.add(f"[len {ln}]")
        later = True
        if kind == _EOL:
            break
    return True


# ------------------------------------------------------------------------------------------ UDP

def udp(p: PrintState, off: int, length: int, ip_off: int, ver: int, fragmented: int) -> None:
    p.proto = "udp"
    src, dst, _, _, first_nh = addresses(p, ip_off, ver)

    def ports(with_ports: bool = True) -> None:
        if first_nh == 17:
            p.add(f"{src}.{p.u16(off)} > {dst}.{p.u16(off + 2)}: " if with_ports else f"{src} > {dst}: ")
        elif with_ports:
            p.add(f"{p.u16(off)} > {p.u16(off + 2)}: ")

    if off + 4 > p.end:
        ports(False)
        raise Truncated(soft=True)
    p.layer("udp", sport=p.u16(off), dport=p.u16(off + 2))
    if length < 8 or off + 6 > p.end:
        ports()
        if length < 8:
            p.add(f"truncated-udp {length}")
            return
        raise Truncated(soft=True)
    ulen = p.u16(off + 4)
    ulen = length if ulen == 0 and length > 65535 else ulen
    ports()
    if ulen < 8:
        p.add(f"truncated-udplength {ulen}")
        return
    ulen, length = ulen - 8, min(length - 8, ulen - 8)
    if off + 8 > p.end:
        raise Truncated(soft=True)
    if p.checks and not fragmented:
        _udp_cksum(p, off, length, ip_off, ver)
    p.add(f"UDP, bad length {ulen} > {length}" if ulen > length and not fragmented else f"UDP, length {ulen}")


def _udp_cksum(p: PrintState, off: int, length: int, ip_off: int, ver: int) -> None:
    """tcpdump -v checks UDP's checksum over IPv6 (it is mandatory there); over IPv4 only with -vv."""
    if ver == 4 and p.verbose < 2:
        return
    field = p.u16(off + 6)
    if ver == 4 and field == 0:
        p.add("[no cksum] ")
    elif off + 8 + length <= p.end:
        computed = transport_cksum(p, ip_off, ver, off, length + 8, 17)
        p.add(f"[bad udp cksum 0x{field:04x} -> 0x{shouldbe(field, computed):04x}!] " if computed
              else "[udp sum ok] ")
