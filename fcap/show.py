"""Packets as text: tcpdump-style one-line summaries, tcpdump -x/-X hex dumps, and scapy's decode."""

from __future__ import annotations

import time

from fcap.dissect import dissect

MAXIMUM_SNAPLEN = 262144


class ScapyMissing(ImportError):
    """scapy_decode() needs scapy (pip install 'fcap[decode]')."""


# ------------------------------------------------------------------------------------------ time and lines

def format_time(ts_ns: int, precision: str = "micro", style: str = "local") -> str:
    """tcpdump's timestamp: local "HH:MM:SS.frac" (default), "date" (-tttt), "epoch" (-tt) or "none" (-t)."""
    if style == "none":
        return ""
    sec, ns = divmod(ts_ns, 1_000_000_000)
    frac = "%09d" % ns if precision == "nano" else "%06d" % (ns // 1000)
    if style == "epoch":
        return f"{sec}.{frac}"
    try:
        tm = time.localtime(sec)
    except (OverflowError, OSError, ValueError):
        return f"{sec}.{frac}"
    return time.strftime("%Y-%m-%d %H:%M:%S" if style == "date" else "%H:%M:%S", tm) + "." + frac


class Summarizer:
    """One line per packet as `tcpdump -nn` prints it, with tcpdump's relative TCP sequence numbers (unless
    relative_seq=False, as -S). prefix (say "[ip_output]") goes between the timestamp and the packet, and first
    on the lines of invalid packets, which tcpdump prints without a timestamp."""

    def __init__(self, precision: str = "micro", time_style: str = "local", relative_seq: bool = True) -> None:
        self.precision, self.time_style = precision, time_style
        self.seqs: dict | None = {} if relative_seq else None

    def __call__(self, ts_ns: int, data: bytes, linktype: int, orig_len: int, prefix: str | None = None) -> str:
        if self.seqs is not None and len(self.seqs) > 100_000:
            self.seqs.clear()  # tcpdump's table only grows; forgetting old conversations costs one absolute line
        text = describe(data, linktype, orig_len, self.seqs)
        stampless = text.startswith("[Invalid header:")  # tcpdump prints no timestamp for these
        if prefix:
            text = f"{prefix} {text}"
        if stampless:
            return text
        stamp = format_time(ts_ns, self.precision, self.time_style)
        return f"{stamp} {text}" if stamp else text

    summary = __call__


def summary(ts_ns: int, data: bytes, linktype: int, orig_len: int, prefix: str | None = None,
            precision: str = "micro", time_style: str = "local") -> str:
    """One tcpdump-like line for a packet on its own (absolute TCP sequence numbers, as tcpdump -S)."""
    return Summarizer(precision, time_style, relative_seq=False)(ts_ns, data, linktype, orig_len, prefix)


def describe(data: bytes, linktype: int, orig_len: int, tcp_seqs: dict | None = None) -> str:
    """The first line tcpdump -nn prints after the timestamp; never raises on damaged packets."""
    caplen = len(data)
    bad = [" caplen==0"] if caplen == 0 else []
    if orig_len == 0 or orig_len < caplen:
        bad.append(" len==0" if orig_len == 0 else f" len({orig_len}) < caplen({caplen})")
    bad += [f" {what}({n}) > {MAXIMUM_SNAPLEN}" for what, n in (("caplen", caplen), ("len", orig_len))
            if n > MAXIMUM_SNAPLEN]
    if bad:
        return "[Invalid header:" + ",".join(bad) + "]"
    return dissect(data, linktype, orig_len, tcp_seqs)


# ------------------------------------------------------------------------------------------ hex and scapy

def hexdump(data: bytes, ascii: bool = False) -> str:
    """tcpdump -x (ascii=False) or -X (ascii=True) lines, "\\t0x0000:  4500 0054 ...  E..T", newline-joined."""
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        hexpart = "".join(" " + chunk[i:i + 2].hex() for i in range(0, len(chunk), 2))
        if ascii:
            text = "".join(chr(c) if 0x21 <= c <= 0x7E else "." for c in chunk)
            lines.append(f"\t0x{off:04x}: {hexpart:<40}  {text}")
        else:
            lines.append(f"\t0x{off:04x}: {hexpart}")
    return "\n".join(lines)


_SCAPY_LAYERS = {0: "Loopback", 108: "Loopback", 1: "Ether", 113: "CookedLinux", 276: "CookedLinuxV2", 228: "IP",
                 229: "IPv6", 105: "Dot11", 127: "RadioTap"}


def scapy_decode(data: bytes, linktype: int) -> str:
    """scapy's show() text for the packet; raises ScapyMissing (an ImportError) when scapy is not installed."""
    try:
        from scapy import all as scapy  # noqa: PLC0415 - optional, and slow to import
    except ImportError as e:
        raise ScapyMissing(f"decoding with scapy needs scapy: pip install 'fcap[decode]' ({e})") from e
    if linktype == 101:
        cls = scapy.IPv6 if data[:1] and data[0] >> 4 == 6 else scapy.IP
    else:
        cls = getattr(scapy, _SCAPY_LAYERS.get(linktype, ""), None) or scapy.conf.l2types.get(linktype)
    return (cls or scapy.conf.raw_layer)(bytes(data)).show(dump=True)
