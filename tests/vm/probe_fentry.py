#!/usr/bin/env python3
"""Does this kernel let us attach fentry/fexit and kprobe programs?  Stdlib only, independent of fcap.

    python3 tests/vm/probe_fentry.py [FUNC]        (default ip_output; run as root)
    tests/vm/run 6.1 -- python3 tests/vm/probe_fentry.py

Finds FUNC's BTF id in /sys/kernel/btf/vmlinux, loads a BPF_PROG_TYPE_TRACING program (expected_attach_type
BPF_TRACE_FENTRY, then FEXIT) that counts calls in an array map, attaches it, sends UDP datagrams over lo (which go
through ip_output) and reads the count; then the same with a kprobe through perf_event_open.  Prints one line per
check; exits 0 when fentry loaded, attached and fired.
"""

import ctypes
import errno
import os
import socket
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_bpf, SYS_perf_event_open = {"aarch64": (280, 241)}.get(os.uname().machine, (321, 298))  # else x86_64
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_PROG_LOAD, BPF_RAW_TRACEPOINT_OPEN = 0, 1, 5, 17
BPF_MAP_TYPE_ARRAY = 2
BPF_PROG_TYPE_KPROBE, BPF_PROG_TYPE_TRACING = 2, 26
BPF_TRACE_FENTRY, BPF_TRACE_FEXIT = 24, 25
BTF_KIND_FUNC = 12


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(bytes(attr), len(attr))
    r = libc.syscall(SYS_bpf, cmd, buf, len(attr))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "bpf(%d): %s" % (cmd, os.strerror(e)))
    return r, buf.raw


def btf_func_id(name, path="/sys/kernel/btf/vmlinux"):
    data = open(path, "rb").read()
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from("<HBBIIIII", data)
    assert magic == 0xEB9F, "not BTF"
    types, strs = hdr_len + type_off, hdr_len + str_off
    off, tid = types, 0
    # bytes following the 12-byte common header, by kind (vlen = number of members/params/...)
    fixed = {1: 4, 3: 12, 14: 4, 17: 4}
    per_vlen = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}
    while off < types + type_len:
        name_off, info, _ = struct.unpack_from("<III", data, off)
        tid += 1
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        if kind == BTF_KIND_FUNC:
            end = data.index(b"\0", strs + name_off)
            if data[strs + name_off:end] == name.encode():
                return tid
        off += 12 + fixed.get(kind, 0) + per_vlen.get(kind, 0) * vlen
    return None


def insn(code, dst=0, src=0, off=0, imm=0):
    return struct.pack("<BBhi", code, dst | (src << 4), off, imm)


def counter_prog(map_fd):
    """*map[0] += 1; return 0"""
    return b"".join([
        insn(0x62, 10, 0, -4, 0),            # *(u32 *)(r10 - 4) = 0
        insn(0xBF, 2, 10),                   # r2 = r10
        insn(0x07, 2, 0, 0, -4),             # r2 += -4
        insn(0x18, 1, 1, 0, map_fd),         # r1 = map (ld_imm64, BPF_PSEUDO_MAP_FD)
        insn(0x00),
        insn(0x85, 0, 0, 0, 1),              # call bpf_map_lookup_elem
        insn(0x15, 0, 0, 2, 0),              # if r0 == 0 goto +2
        insn(0xB7, 1, 0, 0, 1),              # r1 = 1
        insn(0xDB, 0, 1, 0, 0),              # lock *(u64 *)(r0 + 0) += r1
        insn(0xB7, 0, 0, 0, 0),              # r0 = 0
        insn(0x95),                          # exit
    ])


def map_create():
    fd, _ = bpf(BPF_MAP_CREATE, struct.pack("<IIII", BPF_MAP_TYPE_ARRAY, 4, 8, 1).ljust(72, b"\0"))
    return fd


def map_read(fd):
    key, val = ctypes.c_uint32(0), ctypes.c_uint64(0)
    bpf(BPF_MAP_LOOKUP_ELEM, struct.pack("<IIQQQ", fd, 0, ctypes.addressof(key), ctypes.addressof(val), 0))
    return val.value


def prog_load(prog_type, insns, attach_type=0, btf_id=0):
    log = ctypes.create_string_buffer(65536)
    lic = ctypes.create_string_buffer(b"GPL")
    code = ctypes.create_string_buffer(insns, len(insns))
    attr = bytearray(144)
    struct.pack_into("<IIQQIIQ", attr, 0, prog_type, len(insns) // 8, ctypes.addressof(code),
                     ctypes.addressof(lic), 1, len(log), ctypes.addressof(log))
    attr[48:48 + 8] = b"fcapprb\0"
    struct.pack_into("<I", attr, 68, attach_type)
    struct.pack_into("<I", attr, 108, btf_id)
    try:
        return bpf(BPF_PROG_LOAD, attr)[0]
    except OSError as e:
        msg = log.value.decode(errors="replace").strip().splitlines()
        raise OSError(e.errno, "%s%s" % (e.strerror, (" (verifier: %s)" % msg[-1]) if msg else ""))


def traffic(n=5):
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(n):
        b.sendto(b"fcap-probe", a.getsockname())
        a.recv(100)
    a.close()
    b.close()


def check_tracing(func, btf_id, attach_type, label):
    m = map_create()
    try:
        prog = prog_load(BPF_PROG_TYPE_TRACING, counter_prog(m), attach_type, btf_id)
    except OSError as e:
        print("%-7s %s: load refused: %s %s" % (label, func, errno.errorcode.get(e.errno, e.errno), e.strerror))
        return False
    try:
        link, _ = bpf(BPF_RAW_TRACEPOINT_OPEN, struct.pack("<QI", 0, prog).ljust(16, b"\0"))
    except OSError as e:
        print("%-7s %s: loaded, attach refused: %s" % (label, func, e.strerror))
        return False
    traffic()
    n = map_read(m)
    print("%-7s %s: loaded, attached, fired %d times for 5 datagrams" % (label, func, n))
    for fd in (link, prog, m):
        os.close(fd)
    return n > 0


def check_kprobe(func):
    dev = "/sys/bus/event_source/devices/kprobe/type"
    if not os.path.exists(dev):
        print("kprobe  %s: no kprobe PMU (%s missing)" % (func, os.path.dirname(dev)))
        return False
    m = map_create()
    try:
        prog = prog_load(BPF_PROG_TYPE_KPROBE, counter_prog(m))
    except OSError as e:
        print("kprobe  %s: load refused: %s" % (func, e.strerror))
        return False
    name = ctypes.create_string_buffer(func.encode())
    attr = bytearray(128)
    struct.pack_into("<IIQ", attr, 0, int(open(dev).read()), 128, 0)
    struct.pack_into("<Q", attr, 56, ctypes.addressof(name))
    buf = ctypes.create_string_buffer(bytes(attr), 128)
    pfd = libc.syscall(SYS_perf_event_open, buf, -1, 0, -1, 8)
    if pfd < 0:
        print("kprobe  %s: perf_event_open refused: %s" % (func, os.strerror(ctypes.get_errno())))
        return False
    if libc.ioctl(pfd, 0x40042408, prog) < 0 or libc.ioctl(pfd, 0x2400, 0) < 0:  # SET_BPF, ENABLE
        print("kprobe  %s: attach refused: %s" % (func, os.strerror(ctypes.get_errno())))
        return False
    traffic()
    n = map_read(m)
    print("kprobe  %s: loaded, attached, fired %d times for 5 datagrams" % (func, n))
    for fd in (pfd, prog, m):
        os.close(fd)
    return True


def main():
    func = sys.argv[1] if len(sys.argv) > 1 else "ip_output"
    os.sched_setaffinity(0, {0})  # the kprobe's perf event counts on CPU 0
    print("kernel  %s" % os.uname().release)
    btf_id = btf_func_id(func)
    if btf_id is None:
        print("btf     FUNC %s not found in /sys/kernel/btf/vmlinux" % func)
        return 1
    print("btf     FUNC %s is type id %d" % (func, btf_id))
    fentry = check_tracing(func, btf_id, BPF_TRACE_FENTRY, "fentry")
    check_tracing(func, btf_id, BPF_TRACE_FEXIT, "fexit")
    check_kprobe(func)
    return 0 if fentry else 1


if __name__ == "__main__":
    sys.exit(main())
