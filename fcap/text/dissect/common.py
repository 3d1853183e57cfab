"""The common packets' lines in one pass at fixed offsets: whole Ethernet frames with IPv4 (no IP options, not a
fragment) or IPv6 (no extension headers) carrying TCP (options nop, mss, wscale, sackOK, TS), UDP or an ICMP echo.
The line is the one the printers (link, ip, transport, icmp) print, character for character; anything else, or
anything odd about these, is None and goes to them. Addresses and ports are formatted once per flow. --json's
headers the same way (ether_layers, ether_json): the layers the printers record, for a wider set of frames."""

from __future__ import annotations

import socket

from fcap.files.linktypes import VLAN_TPIDS
from fcap.text.dissect.transport import TCP_FLAG_NAMES, conversation, relative

M32 = 0xFFFFFFFF
_FLAGS = tuple("".join(c for bit, c in ((0x01, "F"), (0x02, "S"), (0x04, "R"), (0x08, "P"), (0x10, "."),
                                          (0x20, "U"), (0x40, "E"), (0x80, "W")) if f & bit) or "none"
               for f in range(256))
_MAX_FLOWS = 1 << 16
_inet_ntop, _AF_INET6 = socket.inet_ntop, socket.AF_INET6
_prefixes: dict[bytes, str] = {}   # (version, protocol, addresses and ports) -> "IP a.p > b.q: "


def _prefix(key: bytes, data: bytes, ver: int, ports: bool) -> str:
    """The flow's text up to the protocol's: "IP src.sport > dst.dport: " (ports) or "IP src > dst: "."""
    if len(_prefixes) >= _MAX_FLOWS:
        _prefixes.clear()
    if ver == 4:
        src, dst, at = "%d.%d.%d.%d" % tuple(data[26:30]), "%d.%d.%d.%d" % tuple(data[30:34]), 34
        head = "IP "
    else:
        src, dst, at = _inet_ntop(_AF_INET6, data[22:38]), _inet_ntop(_AF_INET6, data[38:54]), 54
        head = "IP6 "
    if ports:
        text = f"{head}{src}.{data[at] << 8 | data[at + 1]} > {dst}.{data[at + 2] << 8 | data[at + 3]}: "
    else:
        text = f"{head}{src} > {dst}: "
    _prefixes[key] = text
    return text


def ether_line(data: bytes, orig_len: int, seqs: dict | None) -> str | None:
    """The line of a whole Ethernet frame (len(data) == orig_len, no -e) of the common kinds; None otherwise."""
    if len(data) != orig_len or orig_len < 42:
        return None
    etype = data[12] << 8 | data[13]
    ip = _ipv4(data) if etype == 0x0800 else _ipv6(data) if etype == 0x86DD else None
    if ip is None:
        return None
    end, proto, fragmented, off, length, key, ver = ip
    prefix = _prefixes.get(key)
    if proto == 6:
        if end < off + 20:
            return None
        hlen = (data[off + 12] >> 4) * 4
        if hlen < 20 or hlen > length or off + hlen > end:
            return None
        text = _tcp(data, off, length - hlen, hlen, seqs, ver)
        return None if text is None else (prefix or _prefix(key, data, ver, True)) + text
    if proto == 17:
        text = _udp(data, off, length, fragmented)
        return None if text is None else (prefix or _prefix(key, data, ver, True)) + text
    kind = data[off]   # ICMP
    if kind != 8 and kind != 0 or end < off + 8:
        return None
    return (prefix or _prefix(key, data, ver, False)) + \
        f"ICMP echo {'request' if kind == 8 else 'reply'}, id {data[off + 4] << 8 | data[off + 5]}, " \
        f"seq {data[off + 6] << 8 | data[off + 7]}, length {length}"


def _ipv4(data: bytes) -> tuple | None:
    """(end, protocol, fragmented, transport offset, its length, flow key, 4) of an IPv4 packet without options
    (a fragment's offset 0) carrying TCP, UDP or ICMP; else None."""
    if data[14] != 0x45 or data[20] & 0x1F or data[21]:
        return None
    total = data[16] << 8 | data[17]
    if total < 20 or total > len(data) - 14:
        return None
    proto = data[23]
    if proto == 6 or proto == 17:   # (the key's length says the version and whether ports follow)
        key = data[26:38]
    elif proto == 1:
        key = data[26:34]
    else:
        return None
    return 14 + total, proto, data[20] & 0x20, 34, total - 20, key, 4


def _ipv6(data: bytes) -> tuple | None:
    """The same of an IPv6 packet without extension headers carrying TCP or UDP; else None."""
    if len(data) < 54 or data[14] >> 4 != 6:
        return None
    plen = data[18] << 8 | data[19]
    if plen == 0 or plen > len(data) - 54:
        return None
    proto = data[20]
    if proto != 6 and proto != 17:
        return None
    return 54 + plen, proto, 0, 54, plen, data[22:58], 6


def _udp(data: bytes, off: int, length: int, fragmented: int) -> str | None:
    """What follows the addresses and ports of a UDP datagram; None where its header is not all there."""
    if length < 8:
        return None
    ulen = data[off + 4] << 8 | data[off + 5]
    if ulen < 8:
        return None
    ulen, length = ulen - 8, min(length - 8, ulen - 8)
    return f"UDP, bad length {ulen} > {length}" if ulen > length and not fragmented else f"UDP, length {ulen}"


def _tcp(data: bytes, off: int, length: int, hlen: int, seqs: dict | None, ver: int) -> str | None:
    """What follows the addresses and ports of a TCP segment whose header was captured whole; None where its
    options are not the common ones (fcap.text.dissect.transport prints those)."""
    seq = int.from_bytes(data[off + 4:off + 8], "big")
    ack = int.from_bytes(data[off + 8:off + 12], "big")
    flags = data[off + 13]
    if hlen > 20:
        options = _options(data, off + 20, off + hlen)
        if options is None:
            return None
    else:
        options = ""
    if seqs is not None and flags & 0x10:   # as transport.tcp: tcpdump's relative sequence numbers
        sport, dport = data[off] << 8 | data[off + 1], data[off + 2] << 8 | data[off + 3]
        if ver == 4:
            srcb, dstb = data[26:30], data[30:34]
        else:
            srcb, dstb = data[22:38], data[38:54]
        key, rev = conversation(srcb, dstb, sport, dport)
        seq, ack, _ = relative(seqs, key, rev, seq, ack, flags)
    parts = ["Flags [", _FLAGS[flags], "]"]
    if length > 0:
        parts.append(f", seq {seq}:{(seq + length) & M32}")
    elif flags & 0x07:
        parts.append(f", seq {seq}")
    if flags & 0x10:
        parts.append(f", ack {ack}")
    parts.append(f", win {data[off + 14] << 8 | data[off + 15]}")
    if flags & 0x20:
        parts.append(f", urg {data[off + 18] << 8 | data[off + 19]}")
    parts.append(options)
    parts.append(f", length {length}")
    return "".join(parts)


def _options(data: bytes, at: int, end: int) -> str | None:
    """", options [...]" for options of the kinds nop (1), mss (2), wscale (3), sackOK (4) and TS (8), each of its
    own length; None for any other list."""
    out = []
    while at < end:
        kind = data[at]
        if kind == 1:
            out.append("nop")
            at += 1
            continue
        if at + 2 > end:
            return None
        ln = data[at + 1]
        if at + ln > end:
            return None
        if kind == 8 and ln == 10:
            out.append(f"TS val {int.from_bytes(data[at + 2:at + 6], 'big')} "
                       f"ecr {int.from_bytes(data[at + 6:at + 10], 'big')}")
        elif kind == 2 and ln == 4:
            out.append(f"mss {data[at + 2] << 8 | data[at + 3]}")
        elif kind == 3 and ln == 3:
            out.append(f"wscale {data[at + 2]}")
        elif kind == 4 and ln == 2:
            out.append("sackOK")
        else:
            return None
        at += ln
    return ", options [" + ",".join(out) + "]"


# ---- --json's layers ---------------------------------------------------------------------------------------------

def ether_layers(data: bytes, orig_len: int) -> dict | None:
    """The layers dissect() records of an Ethernet frame (fcap.text.dissect.reader.PrintState's, --json's headers),
    in one pass at fixed offsets, for frames without VLAN tags or 802.3 lengths carrying IPv4 (any protocol), IPv6
    without extension headers, ARP or another Ethernet type: the same keys, values and order as the printers',
    as far as the bytes go. None for anything else (the printers record those)."""
    n = len(data)
    if n < 14 or n > orig_len:
        return None
    etype = data[12] << 8 | data[13]
    layers = {"link": {"dst": data[0:6].hex(":"), "src": data[6:12].hex(":"), "ethertype": etype}}
    if etype == 0x0800:
        if n < 34 or data[14] >> 4 != 4:
            return None
        hlen, total, proto = (data[14] & 15) * 4, data[16] << 8 | data[17], data[23]
        layers["ip"] = {"version": 4, "src": "%d.%d.%d.%d" % tuple(data[26:30]),
                        "dst": "%d.%d.%d.%d" % tuple(data[30:34]), "proto": proto, "ttl": data[22], "len": total}
        end = min(n, 14 + total)
        if hlen < 20 or total < hlen or (data[20] << 8 | data[21]) & 0x1FFF or end - 14 < hlen:
            return layers   # (damaged, a later fragment, options not captured: the printers record no more)
        off = 14 + hlen
    elif etype == 0x86DD:
        if n < 54 or data[14] >> 4 != 6:
            return None
        proto = data[20]
        if proto in _IP6_WALKED:
            return None
        plen = data[18] << 8 | data[19]
        layers["ip"] = {"version": 6, "src": _inet_ntop(_AF_INET6, data[22:38]),
                        "dst": _inet_ntop(_AF_INET6, data[38:54]), "ttl": data[21], "len": plen + 40, "proto": proto}
        end, off = min(n, 54 + plen) if plen else 54, 54
        if proto == 58:
            if off + 2 <= end:
                layers["icmp6"] = {"type": data[off], "code": data[off + 1]}
            return layers
    elif etype == 0x0806 or etype == 0x8035:
        return _arp_layers(layers, data, n)
    elif etype <= 1500 or etype == 0x8870 or etype in VLAN_TPIDS:
        return None
    else:
        return layers
    return _transport_layers(layers, data, proto, etype, off, end)


def _arp_layers(layers: dict, data: bytes, n: int) -> dict:
    """ether_layers' ARP (fcap.text.dissect.link._arp: IPv4 addresses only)."""
    if n < 22 or (data[14] << 8 | data[15]) == 19:
        return layers
    hln, pln = data[18], data[19]
    tpa = 22 + 2 * hln + pln
    if tpa + pln <= n and pln == 4 and (data[16] << 8 | data[17]) == 0x0800:
        layers["arp"] = {"op": data[20] << 8 | data[21], "src": "%d.%d.%d.%d" % tuple(data[22 + hln:26 + hln]),
                         "dst": "%d.%d.%d.%d" % tuple(data[tpa:tpa + 4])}
    return layers


def _transport_layers(layers: dict, data: bytes, proto: int, etype: int, off: int, end: int) -> dict:
    """ether_layers' TCP, UDP or ICMP header at off, the datagram ending at end."""
    if proto == 6:
        if off + 4 <= end:
            tcp = layers["tcp"] = {"sport": data[off] << 8 | data[off + 1], "dport": data[off + 2] << 8 | data[off + 3]}
            if off + 20 <= end:
                tcp["flags"] = list(_FLAG_NAMES[data[off + 13]])
                tcp["seq"] = int.from_bytes(data[off + 4:off + 8], "big")
                tcp["ack"] = int.from_bytes(data[off + 8:off + 12], "big")
                tcp["win"] = data[off + 14] << 8 | data[off + 15]
    elif proto == 17:
        if off + 4 <= end:
            layers["udp"] = {"sport": data[off] << 8 | data[off + 1], "dport": data[off + 2] << 8 | data[off + 3]}
    elif proto == 1 and etype == 0x0800:
        if off + 2 <= end:
            layers["icmp"] = {"type": data[off], "code": data[off + 1]}
    return layers


_IP6_WALKED = frozenset((0, 43, 44, 60))   # hop-by-hop, routing, fragment, destination options: fcap.text.dissect.ip
_FLAG_NAMES = tuple(tuple(name for i, name in enumerate(TCP_FLAG_NAMES) if f >> i & 1) for f in range(256))


def ether_json(data: bytes, orig_len: int) -> str | None:
    """ether_layers() as --json writes it ('"link":{...},"ip":{...},"tcp":{...}', compact, no braces around) for
    IPv4 (not a later fragment) and IPv6 (no extension headers) carrying a TCP header captured whole, UDP ports or
    an ICMP / ICMPv6 type and code; None for anything else. A flow's text (addresses, ports) is made once."""
    n = len(data)
    if n < 34 or n > orig_len:
        return None
    etype = data[12] << 8 | data[13]
    ip = _json_ip4(data, n) if etype == 0x0800 else _json_ip6(data, n) if etype == 0x86DD else None
    if ip is None:
        return None
    proto, off, end, length, key = ip
    if proto == 6:
        if off + 20 > end:
            return None
        key += data[off:off + 4]
        flow = _json_flows.get(key) or _json_flow(key, data, etype, proto, off)
        seq, ack = int.from_bytes(data[off + 4:off + 8], "big"), int.from_bytes(data[off + 8:off + 12], "big")
        return f"{flow[0]}{length}{flow[1]}{_FLAG_JSON[data[off + 13]]},\"seq\":{seq},\"ack\":{ack}," \
               f"\"win\":{data[off + 14] << 8 | data[off + 15]}}}"
    if proto == 17:
        if off + 4 > end:
            return None
        key += data[off:off + 4]
    elif proto == 1 and etype == 0x0800 or proto == 58 and etype == 0x86DD:
        if off + 2 > end:
            return None
        key += data[off:off + 2]
    else:
        return None
    flow = _json_flows.get(key) or _json_flow(key, data, etype, proto, off)
    return f"{flow[0]}{length}{flow[1]}"


def _json_ip4(data: bytes, n: int) -> tuple | None:
    """(protocol, transport offset, datagram end, IP length, flow key so far) of ether_json's IPv4; else None."""
    if data[14] >> 4 != 4:
        return None
    hlen, total = (data[14] & 15) * 4, data[16] << 8 | data[17]
    end = min(n, 14 + total)
    if hlen < 20 or total < hlen or (data[20] << 8 | data[21]) & 0x1FFF or end - 14 < hlen:
        return None
    return data[23], 14 + hlen, end, total, data[0:15] + data[22:24] + data[26:34]


def _json_ip6(data: bytes, n: int) -> tuple | None:
    """The same of ether_json's IPv6 (a payload length, no extension header: the protocols taken are not)."""
    if n < 54 or data[14] >> 4 != 6:
        return None
    plen = data[18] << 8 | data[19]
    if not plen:
        return None
    return data[20], 54, min(n, 54 + plen), plen + 40, data[0:14] + data[20:54]


def _json_flow(key: bytes, data: bytes, etype: int, proto: int, off: int) -> tuple[str, str]:
    """A flow's text before the IP length and after it (up to the TCP flags' value)."""
    if len(_json_flows) >= _MAX_FLOWS:
        _json_flows.clear()
    link = f"\"link\":{{\"dst\":\"{data[0:6].hex(':')}\",\"src\":\"{data[6:12].hex(':')}\",\"ethertype\":{etype}}},"
    if etype == 0x0800:
        head = f"\"ip\":{{\"version\":4,\"src\":\"{'%d.%d.%d.%d' % tuple(data[26:30])}\"," \
               f"\"dst\":\"{'%d.%d.%d.%d' % tuple(data[30:34])}\",\"proto\":{proto},\"ttl\":{data[22]},\"len\":"
        tail = "}"
    else:
        head = f"\"ip\":{{\"version\":6,\"src\":\"{_inet_ntop(_AF_INET6, data[22:38])}\"," \
               f"\"dst\":\"{_inet_ntop(_AF_INET6, data[38:54])}\",\"ttl\":{data[21]},\"len\":"
        tail = f",\"proto\":{proto}}}"
    if proto == 6 or proto == 17:
        ports = f"{{\"sport\":{data[off] << 8 | data[off + 1]},\"dport\":{data[off + 2] << 8 | data[off + 3]}"
        tail += f",\"tcp\":{ports},\"flags\":" if proto == 6 else f",\"udp\":{ports}}}"
    else:
        tail += f",\"{'icmp' if proto == 1 else 'icmp6'}\":{{\"type\":{data[off]},\"code\":{data[off + 1]}}}"
    flow = _json_flows[key] = (link + head, tail)
    return flow


_json_flows: dict[bytes, tuple[str, str]] = {}
_FLAG_JSON = tuple("[" + ",".join(f'"{name}"' for name in names) + "]" for names in _FLAG_NAMES)
