"""Packets as text: tcpdump-style one-line summaries, tcpdump -x/-X hex dumps, and scapy's decode."""

from __future__ import annotations

import time
from typing import NamedTuple

from fcap.defaults import NS, SNAPLEN
from fcap.files import linktypes
from fcap.text.dissect import dissect
from fcap.text.dissect.common import ether_line
from fcap.text.dissect.reader import hex_lines


class ScapyMissing(ImportError):
    """scapy_decode() needs scapy (pip install 'fcap[decode]')."""


# ------------------------------------------------------------------------------------------ time and lines

# tcpdump's -t, -tt, -ttt, -tttt, -ttttt by count (0: none of them); more t's than 5 print no time
TIME_STYLES = ("local", "none", "epoch", "delta", "date", "since_first")


def time_style(t_count: int) -> str:
    """The time style of tcpdump's -t flag given t_count times."""
    return TIME_STYLES[t_count] if 0 <= t_count < len(TIME_STYLES) else "none"


def format_time(ts_ns: int, precision: str = "micro", style: str = "local") -> str:
    """tcpdump's timestamp: local "HH:MM:SS.frac" (default), "date" (-tttt), "epoch" (-tt) or "none" (-t).
    (The relative styles, "delta" and "since_first", need the packets before: Summarizer keeps them.)"""
    if style == "none":
        return ""
    sec, ns = divmod(ts_ns, NS)
    frac = "%09d" % ns if precision == "nano" else "%06d" % (ns // 1000)
    if style == "epoch":
        return f"{sec}.{frac}"
    try:
        tm = time.localtime(sec)
    except (OverflowError, OSError, ValueError):
        return f"{sec}.{frac}"
    return time.strftime("%Y-%m-%d %H:%M:%S" if style == "date" else "%H:%M:%S", tm) + "." + frac


def _int32(v: int) -> int:
    return (v & 0xFFFFFFFF) - ((v & 0x80000000) << 1)


def _scaled(stamp: tuple, nano: bool) -> tuple[int, int]:
    """A pcap file's stamp as libpcap hands it to tcpdump: int32 seconds, the fraction in the precision asked."""
    sec, frac, per_second = _int32(stamp[0]), _int32(stamp[1]), stamp[2]
    if per_second == 1_000_000 and nano:
        frac *= 1000
    elif per_second == NS and not nano:
        frac = int(frac / 1000)
    return sec, frac


def format_stamp(stamp: tuple, precision: str = "micro", style: str = "local") -> str:
    """A pcap record's timestamp as its fields hold it, (sec, frac, fractions per second), as tcpdump prints it
    when the fraction is a second or more: libpcap reads both as int32, scales the fraction to the precision asked
    for (in a C long: a micro fraction times 1000, a nano one divided, toward zero), and tcpdump prints the
    fraction's low 32 bits unsigned, and "[Error converting time]" for negative seconds. For the absolute styles
    (local, date, epoch); the relative ones are _Clock's."""
    if style == "none":
        return ""
    nano = precision == "nano"
    sec, frac = _scaled(stamp, nano)
    if sec < 0:
        return "[Error converting time]"
    text = "%0*d" % (9 if nano else 6, frac & 0xFFFFFFFF)
    if style == "epoch":
        return f"{sec}.{text}"
    return time.strftime("%Y-%m-%d %H:%M:%S" if style == "date" else "%H:%M:%S", time.localtime(sec)) + "." + text


class Shown(NamedTuple):
    """What tcpdump prints for a packet: its line; the length of its link-level header as tcpdump counts it,
    which -x and -A leave out (None: an invalid header, after which tcpdump dumps nothing); and tcpdump's own
    dump of bytes it does not decode ("" or lines, each starting with a newline), which goes after the line."""

    line: str
    hdr: int | None
    more: str = ""


class _Clock:
    """Timestamps as tcpdump -ttt (since the packet before) or -ttttt (since the first) print them: a sign, then
    the difference as HH:MM:SS.frac, in the printed precision; worked out on seconds and fractions as tcpdump's
    timevals (a pcap file's odd stamp too, as libpcap passed it on: see format_stamp)."""

    def __init__(self, precision: str, since_first: bool) -> None:
        self.nano = precision == "nano"
        self.per_second = NS if self.nano else 1_000_000
        self.since_first, self.ref = since_first, (0, 0)   # (0, 0): not set (as tcpdump's timeval)

    def __call__(self, ts_ns: int, stamp: tuple | None = None) -> str:
        now = _scaled(stamp, self.nano) if stamp else divmod(ts_ns // (NS // self.per_second), self.per_second)
        if self.ref == (0, 0):
            self.ref = now
        later, earlier = (self.ref, now) if now < self.ref else (now, self.ref)
        sec, frac = later[0] - earlier[0], later[1] - earlier[1]
        if frac < 0:
            sec, frac = sec - 1, frac + self.per_second
        sign = "-" if now < self.ref else " "
        if not self.since_first:
            self.ref = now
        if sec & 0x80000000:
            return sign + "[Error converting time]"
        try:
            hms = time.strftime("%H:%M:%S", time.gmtime(sec))
        except (OverflowError, OSError, ValueError):
            hms = str(sec)
        return sign + hms + "." + "%0*d" % (9 if self.nano else 6, frac & 0xFFFFFFFF)


class Summarizer:
    """One line per packet as `tcpdump -nn` prints it, with tcpdump's relative TCP sequence numbers (unless
    relative_seq=False, as -S), the link-level header with eflag (-e), the time in a style of TIME_STYLES, more of
    each header with verbose (tcpdump's -v count), its checksums checked unless checksums=False (-K).
    prefix (say "[ip_output]") goes between the timestamp and the packet, and first on the lines of invalid
    packets, which tcpdump prints without a timestamp."""

    def __init__(self, precision: str = "micro", time_style: str = "local", relative_seq: bool = True,
                 eflag: bool = False, suppress: bool = False, verbose: int = 0, checksums: bool = True) -> None:
        self.precision, self.time_style, self.eflag, self.suppress = precision, time_style, eflag, suppress
        self.verbose, self.checksums = verbose, checksums
        self.seqs: dict | None = {} if relative_seq else None
        self.clock = _Clock(precision, time_style == "since_first") if time_style in ("delta", "since_first") \
            else None
        self._second, self._hms = None, ""   # (the last second printed, "HH:MM:SS.")

    def __call__(self, ts_ns: int, data: bytes, linktype: int, orig_len: int, prefix: str | None = None,
                 stamp: tuple | None = None) -> str:
        return self.line(ts_ns, data, linktype, orig_len, prefix, stamp)[0]

    summary = __call__

    def line(self, ts_ns: int, data: bytes, linktype: int, orig_len: int, prefix: str | None = None,
             stamp: tuple | None = None) -> Shown:
        """The packet's line, the length of its link-level header as tcpdump counts it for -x and -A, and
        tcpdump's own dump of bytes it does not decode. stamp: see format_stamp()."""
        seqs = self.seqs
        if seqs is not None and len(seqs) > 100_000:
            seqs.clear()  # tcpdump's table only grows; forgetting old conversations costs one absolute line
        text = ether_line(data, orig_len, seqs) if linktype == _EN10MB and not (self.eflag or self.verbose) \
            and orig_len <= SNAPLEN else None
        if text is not None:   # (the common packets' line: fcap.text.dissect.common)
            shown = Shown(text, 14)
        else:
            shown = _describe(data, linktype, orig_len, seqs, self.eflag, self.suppress, self.verbose,
                              self.checksums)
            text = shown.line
        if prefix:
            text = f"{prefix} {text}"
        if shown.hdr is None:  # tcpdump prints no timestamp for these
            return shown._replace(line=text)
        when = self.when(ts_ns, stamp)
        return shown._replace(line=f"{when} {text}" if when else text)

    def when(self, ts_ns: int, stamp: tuple | None = None) -> str:
        """The packet's time as the line starts with it ("" with -t); the relative styles count it as printed."""
        if self.clock:
            return self.clock(ts_ns, stamp)
        if stamp:
            return format_stamp(stamp, self.precision, self.time_style)
        if self.time_style == "local":
            sec, ns = divmod(ts_ns, NS)
            if sec != self._second:
                self._second, self._hms = sec, self.local_hms(sec)
            return self._hms + ("%09d" % ns if self.precision == "nano" else "%06d" % (ns // 1000))
        return format_time(ts_ns, self.precision, self.time_style)

    @staticmethod
    def local_hms(sec: int) -> str:
        """format_time()'s local "HH:MM:SS." of second `sec` (the fraction follows)."""
        return format_time(sec * NS, "micro", "local")[:-6]

    def second_text(self, sec: int) -> str:
        """What when() starts a time in second `sec` with, before its fraction ("HH:MM:SS.", "sec.", the date)."""
        return format_time(sec * NS, "micro", self.time_style)[:-6]

    def stateless_time(self) -> bool:
        """Whether a packet's time depends on it alone (not -ttt or -ttttt, which count from the packets before)."""
        return self.clock is None


_EN10MB = linktypes.EN10MB.number


def summary(ts_ns: int, data: bytes, linktype: int, orig_len: int, prefix: str | None = None,
            precision: str = "micro", time_style: str = "local") -> str:
    """One tcpdump-like line for a packet on its own (absolute TCP sequence numbers, as tcpdump -S)."""
    return Summarizer(precision, time_style, relative_seq=False)(ts_ns, data, linktype, orig_len, prefix)


def describe(data: bytes, linktype: int, orig_len: int, tcp_seqs: dict | None = None, eflag: bool = False) -> str:
    """The first line tcpdump -nn prints after the timestamp; never raises on damaged packets."""
    return _describe(data, linktype, orig_len, tcp_seqs, eflag).line


def _describe(data: bytes, linktype: int, orig_len: int, tcp_seqs: dict | None, eflag: bool,
              suppress: bool = False, verbose: int = 0, checksums: bool = True) -> Shown:
    caplen = len(data)
    bad = [" caplen==0"] if caplen == 0 else []
    if orig_len == 0 or orig_len < caplen:
        bad.append(" len==0" if orig_len == 0 else f" len({orig_len}) < caplen({caplen})")
    bad += [f" {what}({n}) > {SNAPLEN}" for what, n in (("caplen", caplen), ("len", orig_len))
            if n > SNAPLEN]
    if bad:
        return Shown("[Invalid header:" + ",".join(bad) + "]", None)
    d = dissect(data, linktype, orig_len, tcp_seqs, eflag, suppress, verbose, checksums)
    return Shown(d.text, d.hdr, d.more)


# ------------------------------------------------------------------------------------------ hex and scapy

def hexdump(data: bytes, ascii: bool = False) -> str:
    """tcpdump -x (ascii=False) or -X (ascii=True) lines, "\\t0x0000:  4500 0054 ...  E..T", newline-joined."""
    return hex_lines(data, ascii)


_ASCII = bytes(c if 0x21 <= c <= 0x7E or c in b"\t\n \r" else 0x2E for c in range(256))


def asciidump(data: bytes) -> str:
    """tcpdump -A: the bytes as text, "." for what is neither printable nor a tab, space or newline; a carriage
    return left out before a newline and among the last two bytes, else a "."."""
    text = bytes(data).translate(_ASCII)
    if b"\r" not in text:
        return text.decode("ascii")
    n, out, at = len(text), [], 0
    while (cr := text.find(b"\r", at)) >= 0:
        out.append(text[at:cr])
        if n - cr - 1 > 1 and text[cr + 1] != 0x0A:
            out.append(b".")
        at = cr + 1
    out.append(text[at:])
    return b"".join(out).decode("ascii")


# scapy's layer class for a link type (by name: fcap.files.linktypes); RAW is IP or IPv6 by its version nibble
_SCAPY_LAYERS = {linktypes.lookup(name).number: cls for name, cls in (
    ("NULL", "Loopback"), ("LOOP", "Loopback"), ("EN10MB", "Ether"), ("LINUX_SLL", "CookedLinux"),
    ("LINUX_SLL2", "CookedLinuxV2"), ("IPV4", "IP"), ("IPV6", "IPv6"), ("IEEE802_11", "Dot11"),
    ("IEEE802_11_RADIO", "RadioTap"))}


def scapy_class(scapy, data: bytes, linktype: int):
    """scapy's class for a packet of this link type (its raw layer where scapy has none)."""
    if linktype == linktypes.RAW.number:
        return scapy.IPv6 if data[:1] and data[0] >> 4 == 6 else scapy.IP
    cls = getattr(scapy, _SCAPY_LAYERS.get(linktype, ""), None) or scapy.conf.l2types.get(linktype)
    return cls or scapy.conf.raw_layer


def scapy_decode(data: bytes, linktype: int) -> str:
    """scapy's show() text for the packet; raises ScapyMissing (an ImportError) when scapy is not installed."""
    try:
        from scapy import all as scapy  # noqa: PLC0415 - optional, and slow to import
    except ImportError as e:
        raise ScapyMissing(f"decoding with scapy needs scapy: pip install 'fcap[decode]' ({e})") from e
    import logging   # (scapy's own import has it)
    logging.getLogger("scapy").setLevel(logging.ERROR)   # (its warnings about odd packets are not ours to print)
    cls = scapy_class(scapy, data, linktype)
    try:
        return cls(bytes(data)).show(dump=True)
    except Exception as e:  # noqa: BLE001 - scapy's dissectors fail on truncated packets in many ways
        return (f"  (scapy cannot decode this as {cls.__name__}: {type(e).__name__}: {e})\n"
                + scapy.conf.raw_layer(bytes(data)).show(dump=True))
