"""Protocol printers: what tcpdump -nn prints after the timestamp, from the link layer to TCP/UDP/ICMP/ARP."""

from __future__ import annotations

import socket

from fcap import linktypes

_M32 = 0xFFFFFFFF
# Names as tcpdump 4.99 prints them.
_TCP_FLAGS = ((0x01, "F"), (0x02, "S"), (0x04, "R"), (0x08, "P"), (0x10, "."), (0x20, "U"), (0x40, "E"), (0x80, "W"))
_TCP_OPTS = {0: "eol", 1: "nop", 2: "mss", 3: "wscale", 4: "sackOK", 5: "sack", 6: "echo", 7: "echoreply", 8: "TS",
             11: "cc", 12: "ccnew", 13: "", 19: "md5", 20: "scps", 28: "uto", 29: "tcp-ao", 30: "mptcp", 34: "tfo",
             254: "exp"}
_ETHERTYPES = {0x0800: "IPv4", 0x0806: "ARP", 0x8035: "Reverse ARP", 0x86DD: "IPv6", 0x8100: "802.1Q",
               0x88A8: "802.1Q-QinQ", 0x8847: "MPLS unicast", 0x8848: "MPLS multicast", 0x88CC: "LLDP",
               0x888E: "EAPOL", 0x9000: "Loopback", 0x88F7: "PTP", 0x9100: "802.1Q-9100", 0x9200: "802.1Q-9200"}
_BSD_AF = {2: "IPv4", 7: "ISO", 16: "Appletalk", 23: "IPX", 24: "IPv6", 28: "IPv6", 30: "IPv6"}
_ARP_OPS = {1: "Request", 2: "Reply", 3: "Reverse Request", 4: "Reverse Reply", 8: "Inverse Request",
            9: "Inverse Reply", 10: "NACK Reply"}
_ARP_HRD = {1: "Ethernet", 6: "TokenRing", 15: "FrameRelay", 24: "IEEE1394", 32: "Infiniband"}
_SLL_PKTTYPE = {0: "In", 1: "B", 2: "M", 3: "P", 4: "Out"}
_ICMP = {0: "echo reply", 4: "source quench", 8: "echo request", 9: "router advertisement", 10: "router solicitation",
         13: "time stamp request", 14: "time stamp reply", 15: "information request", 16: "information reply",
         17: "address mask request"}
_UNREACH = {0: "net %s unreachable", 1: "host %s unreachable", 5: "%s unreachable - source route failed",
            6: "net %s unreachable - unknown", 7: "host %s unreachable - unknown",
            8: "%s unreachable - source host isolated", 9: "net %s unreachable - admin prohibited",
            10: "host %s unreachable - admin prohibited", 11: "net %s unreachable - tos prohibited",
            12: "host %s unreachable - tos prohibited", 13: "host %s unreachable - admin prohibited filter",
            14: "host %s unreachable - host precedence violation", 15: "host %s unreachable - precedence cutoff"}
_REDIRECT = {0: "redirect %s to net %s", 1: "redirect %s to host %s", 2: "redirect-tos %s to net %s",
             3: "redirect-tos %s to host %s"}


class _Trunc(Exception):
    """The packet ends before a field a printer needs: tcpdump prints " [|proto]" (and args[0] after it)."""


class _BadOpt(Exception):
    """A TCP option longer than the options area."""


class _Packet:
    """Bytes being printed, how far reading is allowed (tcpdump's snapend), the protocol being printed, output."""

    __slots__ = ("b", "end", "out", "proto", "seqs")

    def __init__(self, data: bytes, seqs: dict | None) -> None:
        self.b, self.end, self.out, self.proto, self.seqs = data, len(data), [], "", seqs

    def need(self, off: int, n: int) -> None:
        if off + n > self.end:
            raise _Trunc

    def u8(self, off: int) -> int:
        self.need(off, 1)
        return self.b[off]

    def u16(self, off: int) -> int:
        self.need(off, 2)
        return self.b[off] << 8 | self.b[off + 1]

    def u32(self, off: int) -> int:
        self.need(off, 4)
        return int.from_bytes(self.b[off:off + 4], "big")

    def ip4(self, off: int) -> str:
        self.need(off, 4)
        return "%d.%d.%d.%d" % tuple(self.b[off:off + 4])

    def ip6(self, off: int) -> str:
        self.need(off, 16)
        return socket.inet_ntop(socket.AF_INET6, self.b[off:off + 16])

    def mac(self, off: int, n: int = 6) -> str:
        self.need(off, n)
        return ":".join("%02x" % c for c in self.b[off:off + n])

    def add(self, text: str) -> None:
        self.out.append(text)


def dissect(data: bytes, linktype: int, orig_len: int, tcp_seqs: dict | None = None) -> str:
    """The text for a packet whose lengths describe() found valid; never raises on damaged packets."""
    p = _Packet(data if isinstance(data, bytes) else bytes(data), tcp_seqs)
    try:
        _link(p, linktype, orig_len)
    except _Trunc as e:
        p.add(f" [|{p.proto}]" + (e.args[0] if e.args else ""))
    except (ValueError, IndexError, OverflowError, UnicodeError):  # a printer bug must not stop a capture
        p.add(f" [|{p.proto}: undecodable]")
    return "".join(p.out)


# ------------------------------------------------------------------------------------------ link layers

def _link(p: _Packet, linktype: int, length: int) -> None:
    if linktype == 1:
        _ether(p, 0, length)
    elif linktype in (101, 228, 229):  # tcpdump picks IPv4 or IPv6 by the version nibble for all three
        p.proto = "ipn"
        version = p.u8(0) >> 4 if length >= 1 else None
        if version in (4, 6):
            (_ip if version == 4 else dissect6.ip6)(p, 0, length)
        else:
            p.add(f"truncated-ip {length}" if version is None else f"unknown ip {version}")
    elif linktype == 113:
        p.proto = "sll"
        p.need(0, 16)
        _cooked(p, p.u16(14), 16, length,
                lambda: f"{_SLL_PKTTYPE.get(p.u16(0), '?'):>3} " + (p.mac(6) + " " if p.u16(4) == 6 else ""))
    elif linktype == 276:
        p.proto = "sll2"
        p.need(0, 20)
        try:
            ifname = socket.if_indextoname(p.u32(4))
        except (OSError, OverflowError):
            ifname = "?"
        p.add(f"{ifname:<5} {_SLL_PKTTYPE.get(p.u8(10), '?'):<3} ")
        _cooked(p, p.u16(0), 20, length,
                lambda: f"ifindex {p.u32(4)} " + (p.mac(12) + " " if p.u8(11) == 6 else ""))
    elif linktype in (0, 108):
        p.proto = "null"
        p.need(0, 4)
        family = int.from_bytes(p.b[:4], "little" if linktype == 0 else "big")
        if family & 0xFFFF0000:
            family = int.from_bytes(family.to_bytes(4, "little"), "big")
        if family == 2:
            _ip(p, 4, length - 4)
        elif family in (24, 28, 30):
            dissect6.ip6(p, 4, length - 4)
        else:
            p.add(f"AF {_BSD_AF.get(family, 'Unknown')} ({family}), length {length}: ")
    else:
        name = linktypes.name_of(linktype)
        p.add(f"unknown linktype {linktype}, length {length}" if name.startswith("LINKTYPE_")
              else f"linktype {name} ({linktype}), length {length}")


def _ether(p: _Packet, off: int, length: int) -> None:
    caplen = p.end - off
    if length < caplen:
        p.add(f"[length {length} < caplen {caplen}] (invalid)")
        return
    if caplen < 14:
        p.proto = "ether"
        raise _Trunc
    dst, src, orig = p.mac(off), p.mac(off + 6), length
    etype, off, length = p.u16(off + 12), off + 14, length - 14
    while etype in (0x8100, 0x9100, 0x9200, 0x88A8):  # VLAN tags: tcpdump shows them only with -e
        if p.end - off < 4 or length < 4:
            p.proto = "vlan"
            raise _Trunc
        etype, off, length = p.u16(off + 2), off + 4, length - 4
    if etype <= 1500 or etype == 0x8870:  # 802.3 length or jumbo: an LLC header follows (SNAP only decoded)
        if etype <= 1500:
            length = min(length, etype)
            p.end = min(p.end, off + length)
        _llc(p, off, length, f"{src} > {dst}, 802.3, length {length}: ")
    elif not _ethertype(p, etype, off, length):
        p.add(f"{src} > {dst}, ethertype {_ETHERTYPES.get(etype, 'Unknown')} (0x{etype:04x}), length {orig}: ")


def _llc(p: _Packet, off: int, length: int, header: str) -> None:
    """An 802.2 header: SNAP with an Ethernet type is followed; anything else is only named."""
    p.proto = "llc"
    dsap, ssap, ctrl = p.u8(off), p.u8(off + 1), p.u8(off + 2)
    if dsap == ssap == 0xAA and ctrl == 3:
        p.proto = "snap"
        p.need(off + 3, 5)
        if p.u16(off + 3) == 0 and p.b[off + 5] == 0 and _ethertype(p, p.u16(off + 6), off + 8, length - 8):
            return
    p.add(f"{header}LLC, dsap 0x{dsap:02x}, ssap 0x{ssap:02x}")


def _ethertype(p: _Packet, etype: int, off: int, length: int) -> bool:
    if etype == 0x0800:
        _ip(p, off, length)
    elif etype == 0x86DD:
        dissect6.ip6(p, off, length)
    elif etype in (0x0806, 0x8035):
        _arp(p, off, length)
    else:
        return False
    return True


def _cooked(p: _Packet, etype: int, hdr_len: int, length: int, header) -> None:
    """What follows a Linux cooked header (v1 or v2) of hdr_len bytes; length counts the header."""
    off, length = hdr_len, length - hdr_len
    while etype == 0x8100:
        if p.end - off < 4:
            p.proto = "vlan"
            raise _Trunc
        etype = p.u16(off + 2)
        etype = 4 if etype <= 1500 else etype
        p.add(f"ethertype {_ETHERTYPES.get(etype, 'Unknown')}, ")
        off, length = off + 4, length - 4
    if etype == 4:
        _llc(p, off, length, f"802.2, length {length}: ")
    elif etype == 1:  # IPX: not decoded here
        p.add(f"802.3, length {length}")
    elif etype > 1500 and not _ethertype(p, etype, off, length):
        p.add(header() + f"ethertype {_ETHERTYPES.get(etype, 'Unknown')} (0x{etype:04x}), length {length + hdr_len}: ")


# ------------------------------------------------------------------------------------------ IPv4

def _ip(p: _Packet, off: int, length: int) -> None:
    p.proto = "ip"
    version = p.u8(off) >> 4
    if version != 4:
        p.add(("IP6, wrong link-layer encapsulation" if version == 6 else f"IP{version}") + " (invalid)")
        return
    p.add("IP ")
    p.need(off, 20)
    hlen, total = (p.b[off] & 15) * 4, p.u16(off + 2)
    if length < 20 or hlen < 20:
        p.add(f"truncated-ip {length}" if length < 20 else f"bad-hlen {hlen}")
        return
    if length < total:
        p.add(f"truncated-ip - {total - length} bytes missing! ")
    if total < hlen:
        p.add(f"bad-len {total}")
        return
    p.end = min(p.end, off + total)  # tcpdump's nd_push_snaplen: padding after the datagram is not its payload
    frag, proto, src, dst = p.u16(off + 6), p.u8(off + 9), p.ip4(off + 12), p.ip4(off + 16)
    if frag & 0x1FFF:
        p.add(f"{src} > {dst}: ip-proto-{proto}")
        return
    if proto not in (6, 17):  # (tcpdump's SCTP and DCCP printers print addresses with ports; those are not here)
        p.add(f"{src} > {dst}: ")
    if p.end - off < hlen:
        p.add(f" [remaining caplen({p.end - off}) < header length({hlen})]")
        raise _Trunc
    _ip_demux(p, off + hlen, total - hlen, 4, frag & 0x2000, proto, off)


def _ip_demux(p: _Packet, off: int, length: int, ver: int, fragmented: int, nh: int, ip_off: int) -> None:
    if nh == 6:
        _tcp(p, off, length, ip_off, ver)
    elif nh == 17:
        _udp(p, off, length, ip_off, ver, fragmented)
    elif nh == 1 and ver == 4:
        _icmp(p, off, length)
    elif nh == 58 and ver == 6:
        dissect6.icmp6(p, off, length)
    elif nh in (1, 2, 58):
        p.add(f"[{ {1: 'ICMP', 2: 'IGMP', 58: 'ICMPv6'}[nh]} requires IPv{6 if nh == 58 else 4}] (invalid)"
              if (nh == 58) == (ver == 4) else f" ip-proto-{nh} {length}")
    elif nh in (4, 41):
        (_ip if nh == 4 else dissect6.ip6)(p, off, length)
    else:
        p.add("no next header" if nh == 59 else f" ip-proto-{nh} {length}")


def _addrs(p: _Packet, ip_off: int, ver: int) -> tuple[str, str, bytes, bytes, int]:
    """Source, destination (as text and bytes) and the first next-header field of the IP header at ip_off."""
    if ver == 4:
        return (p.ip4(ip_off + 12), p.ip4(ip_off + 16), p.b[ip_off + 12:ip_off + 16], p.b[ip_off + 16:ip_off + 20],
                p.b[ip_off + 9])
    return p.ip6(ip_off + 8), p.ip6(ip_off + 24), p.b[ip_off + 8:ip_off + 24], p.b[ip_off + 24:ip_off + 40], \
        p.b[ip_off + 6]


# ------------------------------------------------------------------------------------------ TCP, UDP

def _tcp(p: _Packet, off: int, length: int, ip_off: int, ver: int) -> None:
    p.proto = "tcp"
    src, dst, srcb, dstb, first_nh = _addrs(p, ip_off, ver)
    if off + 4 > p.end:
        p.add(f"{src} > {dst}:")
        raise _Trunc
    sport, dport = p.u16(off), p.u16(off + 2)
    p.add(f"{src}.{sport} > {dst}.{dport}: " if first_nh == 6 else f"{sport} > {dport}: ")
    p.need(off, 20)
    hlen = (p.b[off + 12] >> 4) * 4
    if hlen < 20:
        p.add(f" tcp {(length - hlen) & _M32} [bad hdr length {hlen} - too short, < 20]")
        return
    seq, ack, flags, win, urp = p.u32(off + 4), p.u32(off + 8), p.b[off + 13], p.u16(off + 14), p.u16(off + 18)
    p.add("Flags [%s]" % ("".join(c for bit, c in _TCP_FLAGS if flags & bit) or "none"))
    rev, thseq, thack = False, 0, 0
    if p.seqs is not None and flags & 0x10:  # tcpdump's relative sequence numbers, one entry per conversation
        rev = sport > dport or (sport == dport and srcb > dstb)
        key = (dstb, srcb, dport << 16 | sport) if rev else (srcb, dstb, sport << 16 | dport)
        base = p.seqs.get(key)
        if base is None or flags & 0x02:
            p.seqs[key] = base = ((ack - 1) & _M32, seq) if rev else (seq, (ack - 1) & _M32)
        elif rev:
            seq, ack = (seq - base[1]) & _M32, (ack - base[0]) & _M32
        else:
            seq, ack = (seq - base[0]) & _M32, (ack - base[1]) & _M32
        thseq, thack = base
    if hlen > length:
        p.add(f" [bad hdr length {hlen} - too long, > {length}]")
        return
    length -= hlen
    if length > 0 or flags & 0x07:
        p.add(f", seq {seq}" + (f":{(seq + length) & _M32}" if length > 0 else ""))
    p.add((f", ack {ack}" if flags & 0x10 else "") + f", win {win}" + (f", urg {urp}" if flags & 0x20 else ""))
    if hlen > 20:
        p.add(", options [")
        if not _tcp_options(p, off + 20, hlen - 20, thseq if rev else thack):
            return
        p.add("]")
    p.add(f", length {length}")
    if length == 0:
        return
    if p.end - off < hlen:
        p.add(f" [remaining caplen({max(p.end - off, 0)}) < header length({hlen})]")
        raise _Trunc
    # (tcpdump goes on to decode the payload of well-known ports: HTTP, BGP, DNS...; not copied here)


def _tcp_options(p: _Packet, cp: int, hl: int, sack_base: int) -> bool:
    """tcpdump's option list; False when it stopped at a bad option (it then prints no length)."""
    sep = ""
    while hl > 0:
        p.add(sep)
        opt = p.u8(cp)
        ln = 1 if opt in (0, 1) else p.u8(cp + 1)
        cp += 1 if opt in (0, 1) else 2
        if opt not in (0, 1) and (ln < 2 or ln > hl):
            p.add("[bad opt]" + ("]" if sep else ""))
            return False
        hl -= 1 if opt in (0, 1) else 2
        p.add(_TCP_OPTS.get(opt, f"unknown-{opt}"))

        def check(n: int) -> None:  # tcpdump's LENCHECK: past the option is bad, past the capture truncated
            if n > hl:
                raise _BadOpt
            if cp + n > p.end:
                raise _Trunc(">" if sep else "")

        datalen = {2: 2, 3: 1, 6: 4, 7: 4, 11: 4, 12: 4, 13: 4, 8: 8}.get(
            opt, 0 if opt in (0, 1, 4) else ln - 2)
        try:
            if opt in (0, 1, 4):
                pass
            elif opt == 5 and datalen % 8:
                p.add(" invalid sack")
            elif opt == 5:
                p.add(f" {datalen // 8} ")
                for i in range(0, datalen, 8):
                    check(i + 4)
                    start = p.u32(cp + i)
                    check(i + 8)
                    p.add(f"{{{(start - sack_base) & _M32}:{(p.u32(cp + i + 4) - sack_base) & _M32}}}")
            elif opt in (34, 254):  # TCP Fast Open; experimental (RFC 6994: Fast Open's magic, AccECN's...)
                check(datalen)
                if opt == 254 and datalen < 2:
                    raise _BadOpt
                magic, at, size = (p.u16(cp), cp + 2, datalen - 2) if opt == 254 else (0xF989, cp, datalen)
                p.add((" " if opt == 34 else "-tfo" if magic == 0xF989 else f"-{magic:04x}") + (
                    "" if magic != 0xF989 else " cookiereq" if size == 0 else " (invalid)"
                    if size % 2 or not 4 <= size <= 16 else " cookie " + p.b[at:at + size].hex()))
            elif opt in (2, 3, 6, 7, 8, 11, 12, 13):  # fixed sizes
                check(datalen)
                value = int.from_bytes(p.b[cp:cp + datalen], "big")
                p.add(f" val {value >> 32} ecr {value & _M32}" if opt == 8 else f" {value}")
            else:  # the rest as bytes (tcpdump's own printers for md5, mptcp, tcp-ao... are not copied)
                p.add(" 0x" if datalen else "")
                for i in range(datalen):
                    check(i + 1)
                    p.add(f"{p.b[cp + i]:02x}")
        except _BadOpt:
            p.add("[bad opt]" + ("]" if sep else ""))
            return False
        cp, hl = cp + datalen, hl - datalen
        if datalen + (1 if opt in (0, 1) else 2) != ln:
            p.add(f"[len {ln}]")
        sep = ","
        if opt == 0:
            break
    return True


def _udp(p: _Packet, off: int, length: int, ip_off: int, ver: int, fragmented: int) -> None:
    p.proto = "udp"
    src, dst, _, _, first_nh = _addrs(p, ip_off, ver)

    def addresses(ports: bool = True) -> None:
        if first_nh == 17:
            p.add(f"{src}.{p.u16(off)} > {dst}.{p.u16(off + 2)}: " if ports else f"{src} > {dst}: ")
        elif ports:
            p.add(f"{p.u16(off)} > {p.u16(off + 2)}: ")

    if off + 4 > p.end:
        addresses(False)
        raise _Trunc
    if length < 8 or off + 6 > p.end:
        addresses()
        if length < 8:
            p.add(f"truncated-udp {length}")
            return
        raise _Trunc
    ulen = p.u16(off + 4)
    ulen = length if ulen == 0 and length > 65535 else ulen
    addresses()
    if ulen < 8:
        p.add(f"truncated-udplength {ulen}")
        return
    ulen, length = ulen - 8, min(length - 8, ulen - 8)
    if off + 8 > p.end:
        raise _Trunc
    p.add(f"UDP, bad length {ulen} > {length}" if ulen > length and not fragmented else f"UDP, length {ulen}")


# ------------------------------------------------------------------------------------------ ICMP, ARP

def _icmp(p: _Packet, off: int, plen: int) -> None:
    p.proto = "icmp"
    kind, code = p.u8(off), p.u8(off + 1)
    inner = off + 8  # the IP header an error message quotes
    if kind in (0, 8):
        text = f"echo {'request' if kind == 8 else 'reply'}, id {p.u16(off + 4)}, seq {p.u16(off + 6)}"
    elif kind == 3 and code == 3:
        proto = p.u8(inner + 9)
        dport = p.u16(inner + (p.u8(inner) & 15) * 4 + 2)
        what = {6: "tcp port", 17: "udp port"}.get(proto, f"protocol {proto} port")
        text = f"{p.ip4(inner + 16)} {what} {dport} unreachable"
    elif kind == 3 and code in (2, 4):
        mtu = p.u16(off + 6)
        text = (f"{p.ip4(inner + 16)} protocol {p.u8(inner + 9)} unreachable" if code == 2 else
                f"{p.ip4(inner + 16)} unreachable - need to frag" + (f" (mtu {mtu})" if mtu else ""))
    elif kind == 3:
        text = _UNREACH.get(code, "%s unreachable - #" + str(code)) % p.ip4(inner + 16)
    elif kind == 5:
        text = _REDIRECT.get(code, f"redirect-#{code} %s to %s") % (p.ip4(inner + 16), p.ip4(off + 4))
    elif kind == 11:
        p.need(inner + 16, 4)
        text = {0: "time exceeded in-transit", 1: "ip reassembly time exceeded"}.get(code, f"time exceeded-#{code}")
    elif kind == 12:
        text = f"parameter problem - code {code}" if code else f"parameter problem - octet {p.u8(off + 4)}"
    elif kind == 18:
        text = f"address mask is 0x{p.u32(off + 8):08x}"
    elif kind == 13:
        text = f"time stamp query id {p.u16(off + 4)} seq {p.u16(off + 6)}"
    else:  # (router advertisements and time stamp replies carry more than is shown here)
        text = _ICMP.get(kind, f"type-#{kind}")
    p.add(f"ICMP {text}, length {plen}")


def _arp(p: _Packet, off: int, length: int) -> None:
    p.proto = "arp"
    p.need(off, 8)
    hrd, pro, hln, pln, op = p.u16(off), p.u16(off + 2), p.b[off + 4], p.b[off + 5], p.u16(off + 6)
    if hrd == 19:  # ATM ARP: not decoded here
        raise _Trunc
    sha, spa = off + 8, off + 8 + hln
    tha, tpa = spa + pln, spa + pln + hln
    p.need(tpa, pln)
    p.add("ARP, ")
    if pro not in (0x0800, 0x1000) or pln != 4 or hln == 0:
        p.add(f"{_ARP_HRD.get(hrd, f'Unknown Hardware ({hrd})')} (len {hln}), "
              f"{_ETHERTYPES.get(pro, f'Unknown Protocol (0x{pro:04x})')} (len {pln}), length {length}")
        return
    p.add(_ARP_OPS.get(op, f"Unknown ({op})") + " ")
    if op not in _ARP_OPS or op == 10:
        return
    p.add({1: f"who-has {p.ip4(tpa)}" + (f" ({p.mac(tha, hln)})" if any(p.b[tha:tha + hln]) else "")
              + f" tell {p.ip4(spa)}",
           2: f"{p.ip4(spa)} is-at {p.mac(sha, hln)}", 3: f"who-is {p.mac(tha, hln)} tell {p.mac(sha, hln)}",
           4: f"{p.mac(tha, hln)} at {p.ip4(tpa)}", 8: f"who-is {p.mac(tha, hln)} tell {p.mac(sha, hln)}",
           9: f"{p.mac(sha, hln)} at {p.ip4(spa)}"}[op] + f", length {length}")


# IPv6 and ICMPv6: fcap.dissect6, which uses _Packet, _Trunc and _ip_demux from here. Imported after them, so that
# either module may be imported first.
from fcap import dissect6  # noqa: E402
