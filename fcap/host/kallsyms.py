"""Kernel addresses as names (FUNC+0xOFF, a module's functions with [MODULE]), from /proc/kallsyms: read once (at
first use, or before it with load(): the reading takes ~0.2 s, a stall a capture takes before its first record, not
in the middle of its traffic), sorted, looked up by bisection, each address's name cached. Unreadable or hidden
addresses (not root: kptr_restrict zeroes them) leave an address as a number."""

from __future__ import annotations

import bisect

KALLSYMS = "/proc/kallsyms"
_TEXT = frozenset("tTwW")     # functions (weak ones too)


class Symbols:
    """One reading of /proc/kallsyms (or `path`)."""

    def __init__(self, path: str = KALLSYMS):
        self.path = path
        self._addrs: list[int] | None = None
        self._names: list[tuple[str, str]] = []   # (function, module or "")
        self._cache: dict[tuple, str] = {}

    def load(self) -> None:
        """Read the symbols now, unless read already."""
        if self._addrs is None:
            self._read()

    def _read(self) -> None:
        pairs = []
        try:
            with open(self.path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 3 and parts[1] in _TEXT:
                        a = int(parts[0], 16)
                        if a:
                            mod = parts[3].strip("[]") if len(parts) > 3 else ""
                            pairs.append((a, parts[2], mod))
        except (OSError, ValueError):
            pairs = []
        pairs.sort()
        self._addrs = [a for a, _n, _m in pairs]
        self._names = [(n, m) for _a, n, m in pairs]

    def name(self, addr: int, module: bool = True, ret: bool = False) -> str:
        """'FUNC+0xOFF' (' [MODULE]' after it for a module's function when `module`), or the address in hex where
        no function is known. `ret`: addr is a return address (a stack's frame), looked up one byte back, so that a
        call that ends its function names that function, not the next."""
        key = (addr, module, ret)
        text = self._cache.get(key)
        if text is None:
            text = self._cache[key] = self._name(addr, module, ret)
        return text

    def _name(self, addr: int, module: bool, ret: bool) -> str:
        self.load()
        i = bisect.bisect_right(self._addrs, addr - 1 if ret else addr) - 1
        if i < 0 or not addr:
            return f"{addr:#x}"
        func, mod = self._names[i]
        text = f"{func}+{addr - self._addrs[i]:#x}"
        return f"{text} [{mod}]" if module and mod else text


_shared: Symbols | None = None


def shared() -> Symbols:
    """The process's reading of /proc/kallsyms (made at first use)."""
    global _shared
    if _shared is None:
        _shared = Symbols()
    return _shared
