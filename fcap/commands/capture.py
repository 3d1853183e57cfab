"""fcap's capture command: the flags made into a session, a sink and a loop; what it says on stderr as tcpdump does."""

from __future__ import annotations

import sys

from fcap.commands.console import PROG, fail, quiet_stdout
from fcap.commands.flagvalues import decimal_flag, int_flag, print_options
from fcap.defaults import SNAPLEN, TRACK_MAX, check_snaplen
from fcap.errors import FcapError, PredicateError, UsageError


def cmd_capture(args, command: list[str]) -> int:
    from fcap.live import output
    from fcap.live.session import Session
    cfg, count = _config(args)
    rotation = _rotation(args)
    user = None
    if args.user:
        from fcap.live import privileges
        user = privileges.lookup(args.user)
        if rotation is not None:
            output.check_rotation_dir(args.write, rotation, user)
    session = Session(cfg)
    try:
        session.resolve()
        mirror = _mirror(args, session)
        # (--dump-ebpf / -d print the listing on stdout: packets would go to a -w FILE only)
        fmt = _output_format(args, session) if not mirror and (args.write or not (args.dump_ebpf or
                                                                                   args.dump_filter)) else None
        from fcap.features.config import refusal
        why = refusal(session.cfg, session.points, fmt)
        if why:
            raise UsageError(why)
        _no_comment(args, session.cfg, fmt)
        if fmt is not None:
            session.write_file(fmt, args.perf_buffer)
        lines = fmt is None and not mirror and _lines_as_records(args, session)
        if lines:   # (the drains lay the records out as a pcap file's, and the lines are made from them)
            session.write_file("pcap", args.perf_buffer)
        elif args.json and fmt is None and not mirror:   # (numpy imported while the programs load: --json's lines
            from fcap.live.drain import FAST             # are made a batch at a time, fcap.live.jsonlines)
            FAST.load()
        if args.dump_ebpf or args.dump_filter:
            return _dump(session, args)
        session.open()                            # load first: a refused program leaves no file behind
        _filter_note(session, args)
        sink = output.MirrorSink(mirror) if mirror else _sink(args, fmt, rotation, command, lines)
        out = output.start(session, sink, user)
    except FcapError as e:
        session.close()
        return fail(str(e))
    except OSError as e:
        session.close()
        return fail(f"{e.filename or args.write}: {e.strerror}")
    return _run(session, args, out, count, command)


def _secrets(args, fmt: str | None, rotation, command: list[str]) -> tuple:
    """Where the file's TLS secrets come from: --tls-keylog FILE, --tls-secrets (the command's) or --tls-pid PID
    (a running process's); only into one pcapng file (the only format that holds secrets)."""
    said = [flag for flag, value in (("--tls-keylog", args.tls_keylog), ("--tls-secrets", args.tls_secrets),
                                     ("--tls-pid", args.tls_pid)) if value]
    if not said:
        return ()
    if fmt != "pcapng":
        raise UsageError(f"{said[0]}: only pcapng holds secrets (Decryption Secrets Blocks): -w FILE.pcapng")
    if rotation is not None:
        raise UsageError(f"{said[0]}: one file, not a -C/-G series")
    sources = []
    if args.tls_keylog:
        from fcap.host.keylog import KeyLog
        sources.append(KeyLog(args.tls_keylog))
    if args.tls_secrets or args.tls_pid is not None:
        sources.append(_go_secrets(args, command))
    return tuple(sources)


def _go_secrets(args, command: list[str]):
    """--tls-secrets' source: the command's process, or --tls-pid's."""
    pid = int_flag(args.tls_pid, "--tls-pid", 0, 1) if args.tls_pid is not None else None
    if pid is not None and command:
        raise UsageError("--tls-pid: the secrets of one process: --tls-pid PID or -- COMMAND, not both")
    if pid is None and not command:
        hint = " (--pid keeps only the packets handled in PID: not its peer's, which decryption needs)" \
            if args.pid is not None else ""
        raise UsageError(f"--tls-secrets: whose secrets? -- COMMAND, or --tls-pid PID{hint}")
    from fcap.host.gotls import of_process
    from fcap.points.kinds import machine
    return of_process(pid, command, machine())


def _mirror(args, session):
    """--mirror NAME: the interface made (fcap.host.mirror) and its packets left out of the capture, or None."""
    if not args.mirror:
        return None
    if args.write or args.json or args.live_path or args.tls_keylog or args.tls_secrets or args.tls_pid:
        raise UsageError("--mirror: the packets go to the interface; -w, --json, --path and the --tls flags are other "
                         "outputs")
    from fcap.host.mirror import Mirror
    from fcap.kernel.predicates import not_device
    mirror = Mirror(args.mirror, session.linktype.number)
    session.cfg = session.cfg._replace(predicates=[*session.cfg.predicates, not_device(mirror.ifindex,
                                                                                    mirror.netns)])
    return mirror


def _config(args):
    """The session's configuration and the packet count, from the flags (UsageError on nonsense)."""
    from fcap.live.planner import capture_config
    if not args.points:
        raise UsageError("no capture point: give -i POINT (fcap list-devices shows them)")
    snaplen = check_snaplen(int_flag(args.snaplen, "snaplen", SNAPLEN, 0) or SNAPLEN, args.snaplen)
    count = int_flag(args.count, "packet count", 0, 1) if args.count is not None else 0
    buffer_kib = int_flag(args.buffer, "buffer size", 0, 1)   # (0: the default for this machine)
    expr = " ".join(args.expression) or None
    if args.filter_file:
        try:
            with open(args.filter_file) as f:
                expr = " ".join(line.split("#", 1)[0].strip() for line in f).strip() or None
        except OSError as e:
            raise FcapError(f"{args.filter_file}: {e.strerror}") from None
    track_max = int_flag(args.track_max, "tracking map size", TRACK_MAX, 2)
    try:
        return capture_config(args.points, _said(args), linktype=args.linktype or None, snaplen=snaplen, filter=expr,
                              buffer_kib=buffer_kib, immediate=args.immediate, track=args.track,
                              track_max=track_max, comment=not args.no_comment,
                              skb_dynptr=not args.no_skb_dynptr), count
    except PredicateError as e:
        raise UsageError(str(e)) from None


def _said(args):
    """What a predicate's or feature's flag said (fcap.live.planner.capture_config): the numbers as numbers."""
    from fcap.features.selectors import SELECTORS
    numbers = {s.name: int_flag(getattr(args, s.name), s.name, 0, s.least) for s in SELECTORS
               if s.kind is int and getattr(args, s.name) is not None}
    return lambda name: numbers[name] if name in numbers else getattr(args, name)


def _no_comment(args, cfg, fmt: str | None) -> None:
    """--no-comment: only where records have comments, and not with the flags whose output lives in them."""
    if not args.no_comment:
        return
    if fmt != "pcapng":
        raise UsageError("--no-comment: only pcapng records carry a comment (-w FILE.pcapng)")
    from fcap.features.config import in_comment
    for flag in in_comment(cfg):
        raise UsageError(f"--no-comment: {flag} writes into the comment")


def _rotation(args):
    """-C (millions of bytes), -G, -W as tcpdump 4.99 takes them: the plan, or None without one or without a
    -w FILE (tcpdump ignores them then)."""
    from fcap.files.rotate import MILLION, RotationPlan
    plan = RotationPlan(decimal_flag(args.file_size, "file size", 1) * MILLION,
                        decimal_flag(args.seconds, "number of seconds", 0),
                        decimal_flag(args.files, "number of output files", 1))
    if not plan.active or args.write is None:
        return None
    if args.write == "-":
        raise UsageError("-C and -G write a series of files: give -w FILE, not stdout")
    return plan


def _filter_note(session, args) -> None:
    """What the filter compiled into, and each conservative variant the kernel made the capture take, when it is
    worth a line on stderr (before the output is opened)."""
    if not args.quiet:
        for note in session.fallbacks.values():
            sys.stderr.write(f"{PROG}: note: {note}\n")
    if not args.quiet and session.cbpf is not None:
        from fcap.commands.probe_report import filter_note
        note = filter_note(session)
        if note:
            sys.stderr.write(f"{PROG}: {note}\n")


def _dump(session, args) -> int:
    try:
        if args.dump_filter and session.cbpf is not None:
            from fcap.kernel.filter import format_cbpf
            sys.stdout.write("; cBPF (libpcap)\n" + format_cbpf(session.cbpf) + "\n")
        sys.stdout.write(session.dump() + "\n")
        if args.tls_secrets or args.tls_pid is not None:
            from fcap.host.gotls import listing
            from fcap.points.kinds import machine
            sys.stdout.write(listing(machine(), int_flag(args.tls_pid, "--tls-pid", 0, 1)) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()
    return 0


# flags that only change printed lines: given one, a user wants lines even on a pipe (as tcpdump prints them)
_TEXT_FLAGS = ("line_buffered", "numeric", "count_only", "link_header", "ascii", "hex", "hexascii", "verbose", "time",
               "absolute_seq", "nano", "decode")


def _to_stdout(args) -> bool:
    """Whether packets go to stdout as a capture file: -w -, or no -w, stdout not a terminal and no text flag."""
    if args.write is not None:
        return args.write == "-"
    return not sys.stdout.isatty() and not any(getattr(args, f) for f in _TEXT_FLAGS)


def _output_format(args, session) -> str | None:
    """The capture file's format ("pcap" or "pcapng"), or None when packets are printed."""
    from fcap.live.output import file_format
    to_stdout = _to_stdout(args)
    if args.live_path or args.json:
        if args.write:
            raise UsageError("--path prints paths; it does not write a file (fcap path FILE reads one)")
        return None
    return file_format(args.write, args.format, to_stdout, len(session.points))


def _sink(args, fmt: str | None, rotation=None, command: list[str] = (), lines: bool = False):
    """The output the flags ask for: a capture file (stdout's, -w FILE's, -C/-G's series; with the sources of its
    TLS secrets), --path's paths or printed lines (`lines`: made from the records the drains lay out)."""
    from fcap.text.printer import Printer
    secrets = _secrets(args, fmt, rotation, list(command))
    if fmt is not None:
        from fcap.live.output import FileSink
        return FileSink(None if _to_stdout(args) else args.write, fmt, rotation, secrets=secrets)
    if args.live_path:
        from fcap.commands.path_report import PathSink
        return PathSink(Printer(print_options(args), sys.stdout))
    return text_sink(args, lines)


def text_sink(args, lines: bool = False):
    """The output of packets on stdout, a live capture's and -r's: --json's lines or tcpdump's (`lines`: made from
    the records the drains lay out as a pcap file's, fcap.live.printbatch.LinesWriter)."""
    from fcap.text.printer import Printer
    if args.json:
        from fcap.live.output import JsonSink
        return JsonSink(sys.stdout, args.line_buffered)
    from fcap.live.output import PrintSink
    return PrintSink(Printer(print_options(args), sys.stdout), stacks=args.stack, lines=lines)


def _lines_as_records(args, session) -> bool:
    """Whether printed lines can be made from records the drains lay out as a pcap file's, at their speed
    (fcap.live.printbatch.LinesWriter): one point, each packet one line whose time stands alone
    (Printer.lines_only), nothing the features say of a packet (their units but the metadata none), numpy."""
    if args.json or args.live_path or args.dump_ebpf or args.dump_filter or len(session.points) != 1:
        return False
    import importlib.util
    from fcap.features.notes import RecordNotes
    from fcap.features.metadata import Metadata
    from fcap.text.printer import Printer
    return Printer(print_options(args), sys.stdout).lines_only() \
        and all(type(n) is Metadata for n in RecordNotes(session).notes) \
        and importlib.util.find_spec("numpy") is not None


def _run(session, args, out, count: int, command: list[str]) -> int:
    from fcap.kernel import drops
    from fcap.live.loop import CaptureLoop, CommandError, listening_line, skipped_line, write_stderr
    loop = CaptureLoop(session, out, count=count, command=command)
    try:
        loop.ready()
    except OSError as e:   # (mapping the rings, the signals' pipe: ENOMEM, EMFILE)
        session.close()
        return fail(f"cannot start the capture: {e.strerror or e}")
    if not args.quiet:
        write_stderr(listening_line(session))
        if session.skipped:
            write_stderr(f"{PROG}: {skipped_line(session)}")
        note = drops.note(session.points)
        if note:
            write_stderr(f"{PROG}: {note}\n")
    try:
        status = loop.run()
    except CommandError as e:
        return fail(str(e))
    if loop.files_done:     # (tcpdump's line, before the summary)
        write_stderr(f"Maximum file limit reached: {out.rotation.files}\n")
    if loop.error is not None:
        fail(loop.error_line())
    if loop.broken:
        quiet_stdout()
    elif not args.quiet:
        write_stderr(loop.summary())
    return status
