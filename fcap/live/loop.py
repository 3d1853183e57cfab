"""The capture loop of the fcap command: records into one output (a fcap.live.output.Sink: a file, printed lines,
paths), when the capture stops (-c, a signal, a closed pipe, the command's exit), the command it runs, and
tcpdump's summary lines."""

from __future__ import annotations

import os
import signal
import sys

from fcap.errors import CommandError
from fcap.live.output import Sink


GRACE_S = 2.0    # a command still running when the capture ends: SIGTERM, then SIGKILL after this long


class CaptureLoop:
    """One capture: run() drains the session into the output until something stops it, then cleans up and
    returns the exit status: the command's when its exit ended the capture, else 0."""

    def __init__(self, session, out: Sink, count: int = 0, command: list[str] | None = None):
        self.session = session
        self.out = out
        self.count = count
        self.command = command or []
        self.proc = None
        self.stopping = False     # a signal asked us to stop
        self.broken = False       # the reader of our output went away
        self.error: OSError | None = None   # the output could not be written: the capture ended there
        self.written = 0
        self.command_ended = False   # the command's exit ended the capture
        self.files_done = False      # -G -W: the last file's interval is over
        self.drain = None         # the file drain, made by ready()
        self._wakeup: tuple = ()  # the signals' wake-up pipe (read end, write end)

    def ready(self) -> None:
        """What the capture needs before `listening on`: SIGINT and SIGTERM end it gracefully and at once (their
        wake-up fd is watched with the rings), and a file's drain is made (its rings mapped)."""
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wakeup = (rfd, wfd)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        self.session.buffer.watch(rfd)
        writer = self.out.writer
        if writer is not None:
            self.drain = self.session.file_drain(writer, limit=self.count, options=self.out.options.block)

    def run(self) -> int:
        self._start_command()
        try:
            self._drain()
        finally:
            self._close()
        self._end_command()
        return self._status()

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def _start_command(self) -> None:
        if not self.command:
            return
        import subprocess   # (imported where needed: every import is start-up time)
        # packets on stdout: the command's own output must not land in the stream
        stdout = sys.stderr.fileno() if self.out.stream else None
        try:
            self.proc = subprocess.Popen(self.command, stdout=stdout)
        except OSError as e:
            self.session.close()
            raise CommandError(f"{self.command[0]}: {e.strerror}") from None
        self.out.command_started(self.proc.pid)

    def _drain(self) -> None:
        writer = self.out.writer
        if writer is None:   # records one by one (printed, JSON, the API)
            self.session.run(self._deliver, self._should_stop, limit=self.count)
            return
        drain = self.drain or self.session.file_drain(writer, limit=self.count, options=self.out.options.block)
        try:
            self.session.run_file(drain, self._should_stop)
        except OSError as e:
            self._write_failed(e)
        self.written = drain.written

    def _write_failed(self, e: OSError) -> None:
        """A write error ends the capture: quietly for a pipe on stdout whose reader left (as tcpdump), with
        one line (error_line) for anything else."""
        if isinstance(e, BrokenPipeError) and self.out.pipe:
            self.broken = True
        elif self.error is None:
            # (without its traceback, whose frames hold views of the buffers that must close)
            self.error = e.with_traceback(None)

    def error_line(self) -> str:
        e = self.error
        return f"{self.out.error_path()}: {e.strerror or e}" if e is not None else ""

    def _deliver(self, rec) -> bool:
        """The session's sink: the record to the output; False stops the capture."""
        try:
            self.out.write(rec)
        except self.out.failures as e:
            self._write_failed(e)
            return False
        self.written += 1
        return not (self.count and self.written >= self.count)

    def _should_stop(self) -> bool:
        if self.stopping or self.broken:
            return True
        nft = self.session.nft
        if nft is not None:   # --nft: its trace events read at each poll too, so that their buffer does not fill
            nft.pump()
        try:
            if self.out.poll():     # (-G -W: the last file is done)
                self.files_done = True
                return True
        except OSError as e:        # (a stream's reader left, a write or the next file failed)
            self._write_failed(e)
            return True
        if self.proc is not None and self.proc.poll() is not None:
            self.command_ended = True
        return self.command_ended

    def _close(self) -> None:
        """Detach and free the programs, then close the output (the file keeps every record drained)."""
        self.session.close()
        if self._wakeup:
            signal.set_wakeup_fd(-1)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = ()
        try:
            if self.error is None and not self.broken:
                self.out.stats(self.session)
            self.out.close()
        except BrokenPipeError:
            self.broken = True
        except OSError as e:
            self._write_failed(e)

    def _end_command(self) -> None:
        """A command that outlived the capture (-c, a signal): terminated, then killed after GRACE_S."""
        if self.proc is None or self.proc.poll() is not None:
            return
        import subprocess
        self.proc.terminate()
        try:
            self.proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def summary(self) -> str:
        """tcpdump's three lines: captured, received by filter, dropped by kernel."""
        st = self.session.stats

        def n(k: int, what: str) -> str:
            return f"{k} packet{'s' if k != 1 else ''} {what}\n"
        out = n(self.written, "captured") + n(st.seen, "received by filter") + n(st.lost, "dropped by kernel")
        late = self.session.window.disorder()
        if late:   # (fcap.live.order: held up for longer than the window, written at once, after newer ones)
            out += late + "\n"
        nft = self.session.nft
        note = nft.note() if nft is not None else ""
        if note:
            out += note + "\n"
        t = self.session.track_report
        if t:
            out += (f"{t['started']} packet{'s' if t['started'] != 1 else ''} tracked ({t['joined']} clones), "
                    f"{t['evicted']} tracking entries evicted (map of {t['size']})\n")
            out += (f"{t['copied']} cop{'y' if t['copied'] == 1 else 'ies'} of tracked packets followed under their "
                    f"ids, {t['rehomed']} given a new head\n" if t["copies"] else
                    "copies not followed: this kernel refuses fentry/fexit at the copy functions (skb_copy, "
                    "pskb_expand_head, ...), so a copied packet starts a new id\n")
        return out

    def _status(self) -> int:
        if self.error is not None:
            return 1
        if not self.command_ended:
            return 0
        rc = self.proc.returncode
        return rc if rc >= 0 else 128 - rc


SCREENFUL = 24   # points named one by one in the listening line; past that, counted per -i


def listening_line(session) -> str:
    lt = session.linktype
    attached = [p for p in session.points if p.id not in session.unattached]
    return (f"listening on {point_names(attached)}, link-type {lt.name} ({lt.description}), "
            f"snapshot length {session.cfg.snaplen} bytes\n")


def point_names(points) -> str:
    """The points by name, or past a screenful their count and, per -i, a glob's count or the point."""
    if len(points) <= SCREENFUL:
        return ", ".join(p.label for p in points)
    groups: dict[str, int] = {}
    for p in points:
        key = p.origin or p.label
        groups[key] = groups.get(key, 0) + 1
    parts = [f"{k} ({n})" if n > 1 else k for k, n in groups.items()]
    return f"{len(points)} points: " + ", ".join(parts)


def skipped_line(session) -> str:
    """One line for the glob matches the kernel refused (none: "")."""
    skipped = session.skipped
    if not skipped:
        return ""
    names = ", ".join(spec for spec, _why in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
    total = len(skipped) + len(session.points) - len(session.unattached)
    return f"skipped {len(skipped)} of {total} points: {names} (the first because {skipped[0][1]})\n"


def write_stderr(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
