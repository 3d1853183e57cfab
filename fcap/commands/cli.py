"""The fcap command: tcpdump's flags over BTF-found capture points; errors become one line and an exit code."""

from __future__ import annotations

import signal

# Until the capture loop takes SIGINT/SIGTERM over, Ctrl-C ends the command as it ends tcpdump: by the signal,
# without a Python traceback from wherever start-up happened to be.
signal.signal(signal.SIGINT, signal.SIG_DFL)

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Callable, NamedTuple  # noqa: E402

from fcap import __version__  # noqa: E402
from fcap.commands.console import PROG, fail, quiet_stdout  # noqa: E402
from fcap.defaults import BUFFER_KIB_PER_CPU, SNAPLEN, TRACK_MAX  # noqa: E402
from fcap.errors import FcapError, UsageError  # noqa: E402
from fcap.commands.listing import cmd_info, cmd_list  # noqa: E402
from fcap.commands.capture import cmd_capture  # noqa: E402
from fcap.commands.flagvalues import int_flag  # noqa: E402

class _Parser(argparse.ArgumentParser):
    """fcap's parser; the help's epilog (points, commands, examples: fcap.commands.usage) is written only when help
    is printed, as it reads the kinds' and the semantic points' tables, whose imports a capture need not wait for."""

    def format_help(self) -> str:
        if self.epilog is None:
            from fcap.commands.usage import epilog
            self.epilog = epilog(COMMANDS)
        return super().format_help()


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="tcpdump for any point inside the Linux network stack",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", dest="points", action="append", metavar="POINT",
                   help="capture point: fentry/FUNC, tp_btf/TP, a glob, skb:drop, ... (below); -i again for more "
                        "points in the one capture")
    p.add_argument("-w", dest="write", metavar="FILE", help="write packets to FILE (- for stdout)")
    p.add_argument("-C", dest="file_size", metavar="SIZE",
                   help="with -w: a new file when the current one is larger than SIZE million bytes (FILE, FILE1, ...)")
    p.add_argument("-G", dest="seconds", metavar="SECONDS",
                   help="with -w: a new file every SECONDS, FILE's %%-escapes through strftime (local time)")
    p.add_argument("-W", dest="files", metavar="N",
                   help="with -C: a ring of N files (FILE0 ... names padded); with -G: stop after N files")
    p.add_argument("-r", dest="read", metavar="FILE", help="read packets from a pcap/pcapng FILE and print them")
    p.add_argument("-y", dest="linktype", metavar="TYPE", help="link-type: EN10MB, RAW, IPV4, IPV6, LINUX_SLL2")
    p.add_argument("-s", dest="snaplen", metavar="SNAPLEN", help=f"bytes per packet (default {SNAPLEN}; 0 = default)")
    p.add_argument("-c", dest="count", metavar="COUNT", help="stop after COUNT packets")
    p.add_argument("-B", dest="buffer", metavar="KIB",
                   help=f"buffer size in KiB, all CPUs together, each CPU an equal share (default {BUFFER_KIB_PER_CPU} "
                        "per CPU, at most 131072 in all; twice that for pcapng)")
    p.add_argument("-Z", dest="user", metavar="USER",
                   help="once attached and the output open, go on as USER (the output file is USER's)")
    p.add_argument("-U", dest="immediate", action="store_true", help="write each packet as it arrives")
    p.add_argument("-F", dest="filter_file", metavar="FILE", help="read the filter expression from FILE")
    p.add_argument("-d", dest="dump_filter", action="store_true",
                   help="print the compiled filter (cBPF) and the generated eBPF, then exit")
    p.add_argument("-D", dest="list", action="store_true", help="list capture points (as list-devices)")
    p.add_argument("-n", dest="numeric", action="count", default=0, help="no name resolution (always the case)")
    p.add_argument("-x", dest="hex", action="count", default=0, help="print each packet in hex")
    p.add_argument("-X", dest="hexascii", action="count", default=0, help="print each packet in hex and ASCII")
    p.add_argument("-q", dest="quiet", action="store_true", help="no 'listening on' / summary lines")
    p.add_argument("-v", dest="verbose", action="count", default=0,
                   help="verbose lines, as tcpdump -v: the IP headers' fields, checksums checked, an ICMP error's "
                        "quoted packet (-vv: UDP's checksum over IPv4 too, every TCP sequence number)")
    p.add_argument("--decode", action="store_true", help="decode each packet with scapy under its line")
    p.add_argument("--nano", action="store_true", help="nanosecond timestamps in printed lines")
    p.add_argument("-e", dest="link_header", action="count", default=0, help="print the link-level header")
    p.add_argument("-A", dest="ascii", action="count", default=0,
                   help="print each packet in ASCII (-AA: with its link-level header)")
    p.add_argument("-t", dest="time", action="count", default=0,
                   help="-t no time, -tt seconds since 1970, -ttt since the packet before, -tttt date and time, "
                        "-ttttt since the first packet")
    p.add_argument("-l", dest="line_buffered", action="store_true",
                   help="flush the printed lines as they come, at each poll (| grep)")
    p.add_argument("-S", dest="absolute_seq", action="store_true", help="absolute TCP sequence numbers")
    p.add_argument("-K", dest="no_checksums", action="store_true",
                   help="with -v, do not verify the IP, TCP and UDP checksums")
    p.add_argument("--json", action="store_true",
                   help="print each packet as one line of JSON (time, point, metadata, drop reason, dumps, headers) "
                        "for jq; live or with -r")
    p.add_argument("--count", dest="count_only", action="store_true",
                   help="count packets instead of printing them (with -r: print 'N packets')")
    p.add_argument("-L", dest="list_linktypes", action="store_true", help="list the link types of each -i point")
    p.add_argument("-Q", dest="direction", metavar="in|out|inout",
                   help="only packets going in, or out (from the point's direction or the skb's packet type)")
    p.add_argument("--format", choices=("pcap", "pcapng"), help="file format (default: from -w's extension)")
    p.add_argument("--no-comment", dest="no_comment", action="store_true",
                   help="pcapng: no metadata comment in each packet's record (skb, pid, comm, device, drop reason): "
                        "smaller records, less work in the kernel; ids, interfaces, direction, queue, verdicts stay")
    p.add_argument("--dump-ebpf", action="store_true", help="print the generated eBPF program(s) and exit")
    p.add_argument("--tls-keylog", metavar="FILE",
                   help="follow FILE (an SSLKEYLOGFILE, as applications append to it) and write its secrets into the "
                        "pcapng file before the packets they decrypt: Wireshark and tshark decrypt TLS with no setting")
    p.add_argument("--tls-secrets", action="store_true",
                   help="pcapng: the TLS secrets of COMMAND (after --), a Go program, read by a uprobe in its "
                        "crypto/tls (no key log needed) and written into the file before the packets they decrypt, "
                        "as --tls-keylog's")
    p.add_argument("--tls-pid", metavar="PID",
                   help="as --tls-secrets, of the running process PID (a Go program); unlike --pid, every packet "
                        "the filter takes is kept (the peer's replies too)")
    p.add_argument("--mirror", metavar="NAME",
                   help="make an interface NAME on which every captured packet appears, for tcpdump -i NAME, "
                        "tshark -i NAME and any libpcap program (a TAP device, a TUN one for raw IP; packets only "
                        "go out of it, into no network stack; it goes away with fcap)")
    p.add_argument("--perf-buffer", action="store_true",
                   help="writing a file: records through the perf buffer, laid out by fcap (as on kernels without "
                        "file rings), not in the programs' file rings")
    p.add_argument("--no-skb-dynptr", action="store_true",
                   help="act as a kernel without skb dynptrs in tracing programs (before 6.12): the filter sees each "
                        "packet's linear part only, and writing a file, packets with bytes in page frags go through "
                        "the perf buffer, the others into the file rings")
    g = p.add_argument_group("in-kernel predicates (before the filter and the copy; several are ANDed)")
    from fcap.features.selectors import SELECTORS
    for s in SELECTORS:   # (--pid, --comm, ...: one value each)
        g.add_argument(s.flag, dest=s.name, metavar=s.metavar, help=s.help)
    g.add_argument("--cgroup", metavar="PATH",
                   help="only packets of sockets (else tasks) in cgroup2 cgroup PATH or under it (relative to the "
                        "cgroup2 mount, e.g. /system.slice/ssh.service)")
    g.add_argument("--container", metavar="NAME",
                   help="only packets of the container (docker, containerd, cri-o, podman; its id, a prefix, or "
                        "the name podman or docker gave it) or Kubernetes pod (its uid) NAME: its cgroup, as --cgroup")
    g.add_argument("--where", metavar="'PATH OP VALUE'", action="append", default=[],
                   help="a BTF field test, e.g. 'skb->len > 1000', 'skb->dev->name == \"lo\"'; or of the packet's "
                        "context: 'cgroup == PATH', 'container == NAME' (as --cgroup, --container) (repeatable)")
    g = p.add_argument_group("what the kernel held (typed from BTF, printed under each packet; in pcapng with it)")
    from fcap.features import FLAGGED
    for feature in FLAGGED:   # (fcap.features: --context, --nft, --dump, --stack)
        if feature.metavar:
            g.add_argument(feature.flag, dest=feature.name, metavar=feature.metavar, action="append", default=[],
                           help=feature.help)
        else:
            g.add_argument(feature.flag, dest=feature.name, action="store_true", help=feature.help)
        for s in feature.shorthands:
            g.add_argument(s.flag, dest=s.name, action="store_true", help=s.help)
        for s in feature.settings:
            g.add_argument(s.flag, dest=s.name, metavar=s.metavar, action="append", default=[], help=s.help)
    g.add_argument("--dump-style", choices=("multi", "compact"), default="multi",
                   help="--dump's values: one member per line (default) or all on one line")
    g.add_argument("--dump-zeroes", action="store_true", help="--dump's members whose value is zero shown too")
    f = p.add_argument_group("following packets")
    f.add_argument("--track", action="store_true",
                   help="the filter and predicates choose a packet at the first point it passes; then its skb is "
                        "captured at every point until the kernel frees it, under the packet id it got there")
    f.add_argument("--track-max", metavar="N",
                   help=f"entries of the tracking map (default {TRACK_MAX}; evictions counted)")
    f.add_argument("--path", dest="live_path", action="store_true",
                   help="print each packet's path (points in order, time between them, how it ended) as fcap path "
                        "does, instead of the packets")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument("expression", nargs="*", help="filter expression (tcpdump syntax)")
    return p


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        opts, command = _split_command(argv)
        args = _parser().parse_args(opts)
        if args.json:
            _check_json(args)
        if args.list:
            return cmd_list(args.expression)
        if args.list_linktypes:
            return cmd_linktypes(args)
        if args.read:
            return cmd_read(args)
        return cmd_capture(args, command)
    except UsageError as e:
        return fail(str(e), 2)
    except FcapError as e:
        return fail(str(e))
    except KeyboardInterrupt:
        return 130


def cmd_extcap(argv: list[str]) -> int:
    from fcap.commands.extcap import main as extcap_main
    return extcap_main(argv, main)


def cmd_features(argv: list[str]) -> int:
    from fcap.commands.probe_report import main as features_main
    return features_main(argv)


# ---- fcap drops ------------------------------------------------------------------------------

def cmd_drops(argv: list[str]) -> int:
    """fcap drops [-w FILE [FILTER]] [-- COMMAND]: drops counted per reason and location, a table on exit; with -w
    they are captured too (at skb:drop unless -i says otherwise)."""
    from fcap.commands import drop_report as dropscmd
    opts, command = _split_command(argv)
    args = _parser().parse_args(opts)
    if args.read:
        raise UsageError("fcap drops counts live drops; -r makes no sense here")
    if args.json:   # (fcap --json -i skb:drop prints each drop as JSON)
        raise UsageError("fcap drops prints a table; --json makes no sense here (fcap --json -i skb:drop does)")
    counter = dropscmd.Counter()
    counter.start()
    try:
        if args.write:
            args.points = args.points or ["skb:drop"]
            status = cmd_capture(args, command)
        else:
            if not args.quiet:
                sys.stderr.write(f"counting drops at {counter.point.spec}"
                                 f"{'' if command else '; Ctrl-C prints the table'}\n")
            status = dropscmd.wait(command)
        dropscmd.write_table(counter)
    except BrokenPipeError:
        quiet_stdout()
        status = 0
    finally:
        counter.close()
    return status


# ---- reading files ---------------------------------------------------------------------------

def cmd_path(argv: list[str]) -> int:
    """fcap path FILE: each packet's points in order, the time between them, how it ended; hop latencies."""
    from fcap.errors import PcapFormatError
    from fcap.commands.path_report import hops_of_file, report
    ap = argparse.ArgumentParser(prog=f"{PROG} path", description="each packet's path through the points of a "
                                 "pcapng file fcap wrote (several points, e.g. -i skb:drop -i dev:queue --track)")
    ap.add_argument("file")
    ap.add_argument("--stack", action="store_true", help="the kernel stack at each point, where the file has it "
                    "(captured with --stack)")
    a = ap.parse_args(argv)
    try:
        report(hops_of_file(a.file, a.stack), sys.stdout.write)
        sys.stdout.flush()
    except PcapFormatError as e:
        return fail(f"{a.file}: {e}; fcap path needs a pcapng file fcap wrote")
    except BrokenPipeError:
        quiet_stdout()
    return 0


def cmd_read(args) -> int:
    """-r FILE: the file's packets through the output a live capture prints with (fcap.live.output's PrintSink,
    JsonSink), up to -c's count; --count counts them instead."""
    from fcap.commands.capture import text_sink
    from fcap.errors import PcapFormatError
    from fcap.files.pcapread import read
    limit = int_flag(args.count, "packet count", 0, 1) if args.count is not None else 0
    sink = text_sink(args)
    try:
        done, finished = _read_fast(args, sink, limit)
        records = read(sys.stdin.buffer if args.read == "-" else args.read)
        for n, rec in enumerate(records if not finished else (), 1):
            if n > done:
                sink.replay(rec)
            if n == limit:
                break
        if args.count_only:
            sys.stdout.write(sink.printer.count_line())
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()
    except (OSError, PcapFormatError) as e:
        try:
            sys.stdout.flush()     # the packets before the damage, then what is wrong
        except BrokenPipeError:
            quiet_stdout()
        return fail(f"{args.read}: {e.strerror if isinstance(e, OSError) else e}")
    return 0


_FAST_FROM = 2 << 20   # bytes of a file from which -r's lines are made a batch at a time (numpy's import: ~0.1 s)


def _read_fast(args, sink, limit: int) -> tuple[int, bool]:
    """-r's lines of a big pcap or pcapng file made a batch at a time (fcap.text.fastfile) where each packet's lines
    stand alone (fcap.text.printer.Printer.lines_only), or a pcap file's --json lines (fcap.text.fastjson): (packets
    printed, whether that was all)."""
    import os
    printer = getattr(sink, "printer", None)
    if args.read == "-" or getattr(sink, "stacks", False) or printer is not None and not printer.lines_only():
        return 0, False
    try:
        if os.path.getsize(args.read) < _FAST_FROM:
            return 0, False
        if printer is None:   # (--json)
            from fcap.text import fastjson
            return fastjson.json_pcap(args.read, sink.out, sink.file_line, limit)
        from fcap.text import fastfile
    except (OSError, ImportError):   # (no numpy: packet by packet; a file that cannot be read: the reader says)
        return 0, False
    return fastfile.print_pcap(args.read, printer, limit)


# flags that make no sense with --json (its lines have one shape): what they ask for instead, for the error line
_NOT_WITH_JSON = (("write", "-w"), ("hex", "-x"), ("hexascii", "-X"), ("ascii", "-A"), ("link_header", "-e"),
                  ("verbose", "-v"), ("decode", "--decode"),
                  ("count_only", "--count"), ("live_path", "--path"), ("format", "--format"),
                  ("file_size", "-C"), ("seconds", "-G"), ("files", "-W"))


def _check_json(args) -> None:
    """--json prints JSON lines on stdout: a file (-w, -C/-G/-W, --format) or another way of printing is a usage
    error. -t, --nano and -S change nothing (ts_ns is nanoseconds, sequence numbers are absolute)."""
    for attr, flag in _NOT_WITH_JSON:
        if getattr(args, attr):
            raise UsageError(f"--json prints each packet as a JSON line on stdout; {flag} makes no sense with it")


def cmd_linktypes(args) -> int:
    """-L: the link types each -i point can give, as tcpdump -L lists a device's."""
    from fcap.points.spec import resolve
    from fcap.live.planner import START_FOR, default_linktype
    from fcap.files.linktypes import framing, lookup
    if not args.points:
        raise UsageError("-L lists the link types of a capture point: give -i POINT")
    out = []
    for spec in args.points:
        point = resolve(spec)
        first = default_linktype([point]).name
        out.append(f"Data link types for {point.spec} (use option -y to set):\n")
        for name in [first] + [n for n in START_FOR if n != first]:
            lt = lookup(name)
            note = "" if framing(lt.number) is not None else " (printing not supported)"
            out.append(f"  {lt.name} ({lt.description}){note}\n")
    try:
        sys.stdout.write("".join(out))
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()
    return 0


class Subcommand(NamedTuple):
    """A command beside capturing and reading (fcap NAME ...): how it runs and what the help says of it."""

    name: str
    run: Callable[[list[str]], int]
    args: str      # its arguments, as the help shows them
    summary: str   # what it does, in one line


COMMANDS: tuple[Subcommand, ...] = (
    Subcommand("list-devices", cmd_list, "[--semantic] [--json] [GLOB]",
               "every capture point taking a struct sk_buff *, with its prototype (also: list, -D)"),
    Subcommand("info", cmd_info, "POINT...", "a point's prototype and which argument is the skb"),
    Subcommand("features", cmd_features, "[--json]", "what this kernel lets fcap do, tried for real (needs root)"),
    Subcommand("path", cmd_path, "FILE", "each packet's points in order, the time between them, how it ended"),
    Subcommand("drops", cmd_drops, "[-w FILE [FILTER]] [-- COMMAND]",
               "drops counted per reason and location, a table on exit"),
    Subcommand("extcap", cmd_extcap, "--install | --uninstall", "fcap as a Wireshark extcap interface"),
)
SUBCOMMANDS = {c.name: c.run for c in COMMANDS}
SUBCOMMANDS["list"] = cmd_list   # (list-devices' short name)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters


def _malloc_keeps_freed() -> None:
    """glibc's malloc told to serve requests under 64 MB from its heap and to keep up to 128 MB freed there: numpy's
    batch-sized arrays (a batch's columns, -v's sums) then reuse pages already touched, where each new mapping cost
    a fault per page (-r -nn of 200,000 packets: ~51,000 faults, 0.52 → 0.46 s of CPU). The command's own policy,
    not the API's (fcap.read and fcap.batches leave the caller's malloc as it is); no mallopt (musl): nothing."""
    import ctypes
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_TRIM_THRESHOLD, 128 << 20)
        mallopt(_M_MMAP_THRESHOLD, 64 << 20)


def run() -> None:
    """The `fcap` command: main(), then out without the interpreter's teardown (freeing every object of a large
    process takes tens of milliseconds of CPU, all of it after the work is done and the files are closed)."""
    _malloc_keeps_freed()
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    run()
