"""--tls-keylog FILE: an SSLKEYLOGFILE (NSS's key log format, as curl, Firefox, Chrome, Python's ssl and OpenSSL's
-keylogfile append to it) followed while the capture runs: each complete line added since the last look, once.
A file that does not exist yet is waited for; one that shrank or was replaced is read again from its start."""

from __future__ import annotations

import os

LABELS = (b"CLIENT_RANDOM", b"CLIENT_EARLY_TRAFFIC_SECRET", b"CLIENT_HANDSHAKE_TRAFFIC_SECRET",
          b"SERVER_HANDSHAKE_TRAFFIC_SECRET", b"CLIENT_TRAFFIC_SECRET_0", b"SERVER_TRAFFIC_SECRET_0",
          b"EARLY_EXPORTER_SECRET", b"EXPORTER_SECRET", b"RSA")


class KeyLog:
    def __init__(self, path: str):
        self.path = path
        self.pos = 0
        self.ident: tuple | None = None
        self.partial = b""

    def start(self) -> None:
        """(A secrets source of fcap.live.output.SecretsFirst: a key log needs nothing started.)"""

    def follow(self, pid: int) -> None:
        """(Any process's lines are taken: a key log is the applications' own.)"""

    def close(self) -> None:
        """(Nothing held open between reads.)"""

    def new(self) -> bytes:
        """The key log lines added since the last call (each ending in a newline); b"" when none."""
        try:
            st = os.stat(self.path)
        except OSError:
            return b""
        if (st.st_dev, st.st_ino) != self.ident or st.st_size < self.pos:
            self.ident, self.pos, self.partial = (st.st_dev, st.st_ino), 0, b""
        if st.st_size == self.pos:
            return b""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(st.st_size - self.pos)
        except OSError:
            return b""
        self.pos += len(data)
        data = self.partial + data
        end = data.rfind(b"\n") + 1
        self.partial = data[end:]
        return b"".join(line + b"\n" for line in data[:end].splitlines() if line.split(b" ", 1)[0] in LABELS)
