"""--tls-secrets: the TLS secrets of a Go program, read by a uprobe at the entry of crypto/tls's
(*Config).writeKeyLog, which every handshake calls with each secret whether the program logs keys or not (without a
KeyLogWriter it returns at once). The program (a kprobe-type program on the uprobe) copies the label, the client
random and the secret into one fixed-size record on a perf buffer; user space keeps the named process's records
only and hands them on as NSS key log lines, with the same new() as fcap.host.keylog.KeyLog."""

from __future__ import annotations

import os
import struct

from bpf.asm import (DW, FP, JEQ, JLE, JNE, R0, R1, R2, R3, R4, R5, R6, W, addi, call, exit_, jmp, label,
                     ld_imm64, ld_map_fd, ldx, mov, movi, rshi, st, stx)
from bpf.errors import BPFError, ElfError, NoSymbol
from bpf.uapi import F_CURRENT_CPU, Helper

from fcap.errors import CaptureError
from fcap.host.keylog import LABELS

SYMBOL = "crypto/tls.(*Config).writeKeyLog"   # func (c *Config) writeKeyLog(label string, clientRandom, secret []byte)
# Go's register ABI (amd64 since Go 1.17, arm64 since 1.18) at writeKeyLog's entry: the receiver in the first
# integer register, then the label's pointer and length, the client random's pointer, length (and capacity), the
# secret's pointer and length, as the members of the kprobe context (bpf_user_pt_regs_t) that hold them; per machine
# as the kernel names it (fcap.points.kinds.machine())
GO_ARGS = {
    "x86_64": {"label": "bx", "label_len": "cx", "random": "di", "random_len": "si", "secret": "r9",
               "secret_len": "r10"},
    "aarch64": {"label": "regs[1]", "label_len": "regs[2]", "random": "regs[3]", "random_len": "regs[4]",
                "secret": "regs[6]", "secret_len": "regs[7]"},
}
FIELDS = (("label", 32), ("random", 32), ("secret", 64))   # each argument's bytes the record holds, at most
RECORD = struct.Struct("<IIII32s32s64s")   # tgid, the three lengths (0: not read), the three fields' bytes
RANDOM_LEN = 32
PAGES = 8   # the perf buffer's pages per CPU (a handshake's five records are ~800 bytes)


def program(offsets: dict[str, int], events_fd: int, tgid: int = 0) -> list:
    """At writeKeyLog's entry: the record of the secret (on the stack, zeroed first) to the perf buffer; with `tgid`
    only in that process. `offsets`: where the context holds each argument (context_offsets). Each length is
    clamped to its field on every path (so any verifier knows the read's bounds); a read that fails leaves a
    length of 0."""
    rec = -RECORD.size
    items = [mov(R6, R1), call(Helper.get_current_pid_tgid), rshi(R0, 32)]
    if tgid:
        items.append(jmp(JNE, R0, tgid, "out"))
    items += [st(DW, FP, rec + i, 0) for i in range(0, RECORD.size, 8)]
    items.append(stx(W, FP, rec, R0))
    data = rec + 16
    for i, (name, most) in enumerate(FIELDS):
        length = rec + 4 + 4 * i
        items += [ldx(DW, R2, R6, offsets[name + "_len"]), jmp(JLE, R2, most, f"{name}_fits"), movi(R2, most),
                  label(f"{name}_fits"), stx(W, FP, length, R2), mov(R1, FP), addi(R1, data),
                  ldx(DW, R3, R6, offsets[name]), call(Helper.probe_read_user), jmp(JEQ, R0, 0, f"{name}_read"),
                  st(W, FP, length, 0), label(f"{name}_read")]
        data += most
    return items + [mov(R1, R6), ld_map_fd(R2, events_fd), ld_imm64(R3, F_CURRENT_CPU), mov(R4, FP), addi(R4, rec),
                    movi(R5, RECORD.size), call(Helper.perf_event_output), label("out"), movi(R0, 0), exit_()]


def listing(machine: str, tgid: int = 0) -> str:
    """The program as --dump-ebpf prints it (its perf buffer's map shown as fd 0)."""
    from bpf.asm import disassemble
    return (f"; --tls-secrets: a uprobe at the entry of {SYMBOL}\n" +
            disassemble(program(context_offsets(machine), 0, tgid)))


def context_offsets(machine: str) -> dict[str, int]:
    """Where a kprobe program's context (the kernel's bpf_user_pt_regs_t) holds each of writeKeyLog's arguments on
    `machine`: the registers Go passes them in (GO_ARGS), their offsets read by name from the kernel's BTF."""
    from bpf.btf import BTF
    from bpf.errors import BTFError
    regs = GO_ARGS.get(machine)
    if regs is None:
        raise CaptureError(f"--tls-secrets: fcap does not know where Go passes arguments on {machine} (it knows "
                           f"{', '.join(GO_ARGS)})")
    try:
        context = BTF.vmlinux().find("bpf_user_pt_regs_t", "typedef")
        if context is None:
            raise BTFError("find bpf_user_pt_regs_t", "not in this kernel's BTF")
        out = {}
        for arg, member in regs.items():
            name, _, index = member.partition("[")
            m, bits = context.strip().member(name)
            out[arg] = bits // 8 + (int(index.rstrip("]")) * m.type.strip().elem.strip().size if index else 0)
    except BTFError as e:
        raise CaptureError(f"--tls-secrets: {e}") from None
    return out


def key_log_line(raw, tgid: int) -> bytes:
    """A record as its NSS key log line (`LABEL <client random> <secret>` in hex); b"" when it is not process
    `tgid`'s or not a whole secret (a read that failed, a label NSS's format does not have)."""
    pid, label_len, random_len, secret_len, lab, rnd, secret = RECORD.unpack_from(raw)
    name = lab[:label_len]
    if pid != tgid or not tgid or name not in LABELS or random_len != RANDOM_LEN or not secret_len:
        return b""
    return b"%s %s %s\n" % (name, rnd[:random_len].hex().encode(), secret[:secret_len].hex().encode())


def of_process(pid: int | None, command: list[str], machine: str) -> GoSecrets:
    """The secrets of process `pid` (its executable /proc/PID/exe, which the kernel follows to the file in whatever
    mount namespace), or else of the command (its executable found as the command will run it: PATH searched), on
    `machine` (os.uname()'s)."""
    if pid is not None:
        exe = f"/proc/{pid}/exe"
        try:
            shown = os.readlink(exe)
        except OSError as e:
            why = "no such process" if not os.path.isdir(f"/proc/{pid}") else f"{exe}: {e.strerror}"
            raise CaptureError(f"--tls-pid {pid}: {why}") from None
        return GoSecrets(exe, machine, pid, shown)
    import shutil
    found = shutil.which(command[0])
    if found is None:
        raise CaptureError(f"--tls-secrets: {command[0]}: command not found")
    return GoSecrets(found, machine)


class GoSecrets:
    """The TLS secrets of one process running a Go program (--tls-secrets): its executable checked when made,
    start() loads the program and attaches its uprobe (before the command runs), follow(pid) names the process
    when it is the command's, new() gives its secrets read since the last call as key log lines, close() detaches
    and frees everything."""

    def __init__(self, binary: str, machine: str, pid: int = 0, shown: str = ""):
        self.binary, self.machine = binary, machine
        self.pid = pid   # the process whose secrets are kept (0: none yet; a command's, once it runs)
        self.program_pid = pid   # the process the program tests for (0: every process: a command's is not known)
        shown = shown or binary
        try:
            from bpf.elf import symbol_offset
            self.offset = symbol_offset(binary, SYMBOL)
        except NoSymbol:
            raise CaptureError(f"--tls-secrets: {shown} has no {SYMBOL} (not a Go program using crypto/tls, or "
                               f"stripped)") from None
        except ElfError as e:
            raise CaptureError(f"--tls-secrets: {shown}: {e.cause}") from None
        self.events = self.buffer = self.prog = self.link = None
        self._lines: list[bytes] = []

    def start(self) -> None:
        from bpf.link import attach_uprobe
        from bpf.maps import PerfEventArrayMap
        from bpf.perfbuf import PerfBuffer
        from bpf.prog import load
        from bpf.uapi import ProgType
        offsets = context_offsets(self.machine)
        try:
            self.events = PerfEventArrayMap(name="fcap_tls")
            self.buffer = PerfBuffer(self.events, pages=PAGES)
            self.prog = load(ProgType.KPROBE, program(offsets, self.events.fileno(), self.program_pid),
                             name="fcap_tls_go", what=f"uprobe at {SYMBOL}")
            self.link = attach_uprobe(self.prog.fileno(), self.binary, self.offset)
        except BPFError as e:
            self.close()
            raise CaptureError(f"--tls-secrets: {e}") from None

    def follow(self, pid: int) -> None:
        """The command runs as `pid`: its secrets are the ones kept."""
        if not self.program_pid:
            self.pid = pid

    def new(self) -> bytes:
        """The process's secrets read since the last call, as key log lines; b"" when none."""
        if self.buffer is None:
            return b""
        self.buffer.drain(self._record)
        lines, self._lines = self._lines, []
        return b"".join(lines)

    def _record(self, _cpu: int, raw: memoryview) -> None:
        if len(raw) >= RECORD.size:
            line = key_log_line(raw, self.pid)
            if line:
                self._lines.append(line)

    def close(self) -> None:
        for o in (self.link, self.prog, self.buffer, self.events):
            if o is not None:
                o.close()
        self.link = self.prog = self.buffer = self.events = None
