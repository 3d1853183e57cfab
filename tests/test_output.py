"""The output layer's one interface (fcap.live.output.Sink) on its own: a sink that is neither the command line's
nor the API's, driven by the capture loop through a live capture on lo, gets its calls in the interface's order
(open before the programs are attached, every record in time order, stats, close) and the very packets a file
written by the fcap command at the same time holds; a capture whose attach fails leaves no file (start())."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from netns import send_udp, start_fcap

POINT = "tp_btf/net_dev_queue"
N = 5


def _collector():
    from fcap.live.output import Sink

    class Collect(Sink):
        def __init__(self):
            self.calls: list[str] = []
            self.records: list = []

        def open(self, session) -> None:
            super().open(session)
            self.calls.append(f"open attached={bool(session.links)}")

        def write(self, rec) -> None:
            self.calls.append("write")
            self.records.append((rec.ts_ns + self.session.clock_offset_ns, bytes(rec.data), rec.orig_len))

        def stats(self, session) -> None:
            self.calls.append(f"stats detached={not session.links}")

        def close(self, ok: bool = True) -> None:
            self.calls.append(f"close ok={ok}")
    return Collect()


def _session(port: int):
    from fcap.live.session import Config, Session
    s = Session(Config(points=[POINT], filter=f"udp and dst port {port}", immediate=True))
    s.resolve()
    s.open()
    return s


def test_a_custom_sink_gets_what_the_file_holds(sink, tmp_path):
    from fcap.live import output
    from fcap.live.loop import CaptureLoop
    path = tmp_path / "beside.pcapng"
    fc = start_fcap(["-i", POINT, "-c", str(N), "-w", str(path), f"udp and dst port {sink.port}"])
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    collect = _collector()
    try:
        session = _session(sink.port)
        output.start(session, collect)
        loop = CaptureLoop(session, collect, count=N)
        loop.ready()
        payloads = [os.urandom(8) + bytes(range(256))[:i * 40] for i in range(N + 2)]
        sender = threading.Thread(target=lambda: (time.sleep(0.2), send_udp("127.0.0.1", sink.port, payloads,
                                                                             pace=0.002)), daemon=True)
        sender.start()
        assert loop.run() == 0 and loop.error is None and not loop.broken
        sender.join()
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
        for sig, h in handlers.items():
            signal.signal(sig, h)
    assert collect.calls == ["open attached=False"] + ["write"] * N + ["stats detached=True", "close ok=True"]
    got = collect.records
    assert [ts for ts, _d, _n in got] == sorted(ts for ts, _d, _n in got)
    from fcap.files.pcapread import read
    in_file = list(read(path))
    assert [(bytes(r.data), r.orig_len) for r in in_file] == [(d, n) for _ts, d, n in got]
    assert all(abs(r.ts_ns - ts) < 10**9 for r, (ts, _d, _n) in zip(in_file, got))


def test_a_failed_attach_leaves_no_file(sink, tmp_path, monkeypatch):
    from fcap.errors import CaptureError
    from fcap.live import output
    session = _session(sink.port)
    try:
        def refuse():
            raise CaptureError("refused here")
        monkeypatch.setattr(session, "attach", refuse)
        path = tmp_path / "never.pcapng"
        out = output.FileSink(str(path), "pcapng")
        with pytest.raises(CaptureError, match="refused here"):
            output.start(session, out)
        assert out.writer is not None and not path.exists()
    finally:
        session.close()
