"""Text output of the command line: one tcpdump line per packet with tcpdump's flags for it (-e -v -t... -S --nano),
then -x/-X/-A dumps or scapy's decode (--decode); --count counts instead; -l flushes each packet's lines."""

from __future__ import annotations

from typing import NamedTuple, TextIO


class PrintOptions(NamedTuple):
    """How packets are printed: tcpdump's printing flags (the command line's, fcap.commands.cli.print_options)."""

    hex: int = 0                 # -x (twice: -xx)
    hexascii: int = 0            # -X
    ascii: int = 0               # -A
    verbose: int = 0             # -v (-vv...): tcpdump's verbose lines
    no_checksums: bool = False   # -K: -v checks no IP, TCP or UDP checksum
    decode: bool = False         # --decode: scapy's decode under each line
    count_only: bool = False     # --count
    line_buffered: bool = False  # -l
    nano: bool = False           # --time-stamp-precision=nano
    time: int = 0                # -t, -tt, ...
    absolute_seq: bool = False   # -S
    link_header: int = 0         # -e
    dump_style: str | None = None   # --dump-style
    dump_zeroes: bool = False    # --dump-zeroes


class Printer:
    """Prints packets as `fcap -i ...` (on a terminal) and `fcap -r` show them, as `options` say."""

    def __init__(self, options: PrintOptions, out: TextIO):
        from fcap.text import show
        self.out = out
        self.hex, self.hexascii, self.ascii = options.hex, options.hexascii, options.ascii
        self.decode = options.decode
        self.count_only = options.count_only
        self.line_buffered = options.line_buffered
        self.counted = 0
        self.summarizer = show.Summarizer(precision="nano" if options.nano else "micro",
                                          time_style=show.time_style(options.time),
                                          relative_seq=not options.absolute_seq, eflag=options.link_header > 0,
                                          suppress=bool(self.hex or self.hexascii), verbose=options.verbose,
                                          checksums=not options.no_checksums)
        self.dump_compact = options.dump_style == "compact"
        self.dump_zeroes = options.dump_zeroes

    def packet(self, ts_ns: int, data: bytes, linktype: int, orig_len: int, point: str | None = None,
               stamp: tuple | None = None) -> None:
        """One packet's line (point, when given, after the timestamp), then its dump or scapy's decode. stamp: a
        pcap file's odd timestamp as it holds it (fcap.files.pcapread.FileRecord.stamp), printed as tcpdump does."""
        self.counted += 1
        if self.count_only:
            return
        self.out.write(self.text(ts_ns, data, linktype, orig_len, point, stamp))
        if self.line_buffered:
            self.out.flush()

    def text(self, ts_ns: int, data: bytes, linktype: int, orig_len: int, point: str | None = None,
             stamp: tuple | None = None) -> str:
        """What packet() prints of the packet (its line, its dump or decode, each line ending in a newline)."""
        shown = self.summarizer.line(ts_ns, data, linktype, orig_len, point, stamp)
        parts = [shown.line, shown.more]
        if shown.hdr is not None:
            dump = self._dump(data, shown.hdr)
            if dump:
                parts += ["\n", dump]
        parts.append("\n")
        if self.decode:
            parts += self._decoded(data, linktype)
        return "".join(parts)

    def lines_only(self) -> bool:
        """Whether each packet is its lines and nothing under them (no -x/-X/-A, --decode, -e or --count; -v's
        lines are the IP header's and the packet's) and its time stands alone (not -ttt, -ttttt): the case
        fcap.text.fastlines makes a batch at a time (with -l, flushed after each batch)."""
        return not (self.hex or self.hexascii or self.ascii or self.decode or self.count_only
                    or self.summarizer.eflag) and self.summarizer.stateless_time()

    def write_batch(self, text) -> None:
        """Lines made by fcap.text.fastlines (ASCII bytes: into the stream's binary buffer, after what it holds;
        decoded where it has none), flushed with -l."""
        write_lines(self.out, text)
        if self.line_buffered:
            self.out.flush()

    def _dump(self, data: bytes, hdr: int) -> str:
        """-X, -x or -A (in that order of precedence, as tcpdump): once, what follows the link-level header;
        twice, the whole packet."""
        from fcap.text import show
        count = self.hexascii or self.hex or self.ascii
        if not count:
            return ""
        if count == 1:
            if len(data) <= hdr:
                return ""
            data = data[hdr:]
        if self.hexascii or self.hex:
            return show.hexdump(data, ascii=bool(self.hexascii))
        return show.asciidump(data)

    def _decoded(self, data: bytes, linktype: int) -> list[str]:
        from fcap.text import show
        try:
            return [show.scapy_decode(data, linktype), "\n"]
        except ImportError as e:  # said once: the next packets get their lines only
            self.decode = False
            return [f"  ({e})\n"]

    def count_line(self) -> str:
        """tcpdump --count's line for a file: "N packets"."""
        return f"{self.counted} packet{'' if self.counted == 1 else 's'}\n"

    def dumps(self, dumps) -> None:
        """A packet's --dump values (fcap.kernel.dumps.Dump) under its line, each line indented by two spaces."""
        text = "\n".join(d.line(self.dump_compact, self.dump_zeroes) for d in dumps)
        self.out.write("  " + text.replace("\n", "\n  ") + "\n")

    def stack(self, frames: tuple) -> None:
        """A packet's --stack frames under its line, innermost first, each indented by two spaces."""
        if self.count_only:
            return
        self.out.write("".join(f"  {f}\n" for f in frames) if frames else "  (stack unknown)\n")

    def flush(self) -> None:
        self.out.flush()


def formatted(template: str, values: tuple) -> bytes | str:
    """template % values for a batch's lines: as bytes where the template is ASCII (bytes' % finds the next % by
    memchr, a quarter cheaper than str's), as str otherwise; write_lines writes either."""
    return template.encode("ascii") % values if template.isascii() else template % values


CHUNK = 512   # lines %-formatted at once (formatted_rows)


def formatted_rows(parts, values, starts) -> list:
    """A batch's lines, `parts` (an object array: a row per line, its templates' texts in the columns) %-formatted
    with `values` (every row's, in order; starts: where each row's begin), CHUNK rows at a time: each piece's text
    stays in the CPU's caches from its join to its format and write (a whole batch's, megabytes of live JSON, did
    not: its lines cost a tenth more). Pieces of bytes or str (formatted's), for write_lines."""
    n, per = parts.shape
    texts, vals, starts = parts.ravel().tolist(), values.tolist(), starts.tolist() + [len(values)]
    ends = [min(n, a + CHUNK) for a in range(0, n, CHUNK)]
    return [formatted("".join(texts[a * per:b * per]), tuple(vals[starts[a]:starts[b]]))
            for a, b in zip(range(0, n, CHUNK), ends)]


def write_lines(out: TextIO, text) -> None:
    """Text made a batch at a time into a text stream (str, bytes or a list of them: formatted_rows' pieces): ASCII
    bytes into its binary buffer, after what the stream holds (decoded where it has none), str as it is."""
    for piece in (text if isinstance(text, list) else (text,)):
        if isinstance(piece, str):
            out.write(piece)
            continue
        buffer = getattr(out, "buffer", None)
        if buffer is None:
            out.write(piece.decode("ascii"))
        else:
            out.flush()
            buffer.write(piece)
