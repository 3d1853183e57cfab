"""Constants from the kernel UAPI (linux/bpf.h, linux/perf_event.h) as IntEnums, in one place."""

import os
from enum import IntEnum, IntFlag

# bpf() and perf_event_open() per machine (arch/x86/entry/syscalls/syscall_64.tbl; arm64 has asm-generic's numbers)
SYSCALLS = {"x86_64": (321, 298), "aarch64": (280, 241)}
SYS_BPF, SYS_PERF_EVENT_OPEN = SYSCALLS.get(os.uname().machine, SYSCALLS["x86_64"])


class Cmd(IntEnum):
    MAP_CREATE = 0
    MAP_LOOKUP_ELEM = 1
    MAP_UPDATE_ELEM = 2
    MAP_DELETE_ELEM = 3
    MAP_GET_NEXT_KEY = 4
    PROG_LOAD = 5
    OBJ_PIN = 6
    OBJ_GET = 7
    PROG_ATTACH = 8
    PROG_DETACH = 9
    PROG_TEST_RUN = 10
    PROG_GET_NEXT_ID = 11
    MAP_GET_NEXT_ID = 12
    PROG_GET_FD_BY_ID = 13
    MAP_GET_FD_BY_ID = 14
    OBJ_GET_INFO_BY_FD = 15
    PROG_QUERY = 16
    RAW_TRACEPOINT_OPEN = 17
    BTF_LOAD = 18
    BTF_GET_FD_BY_ID = 19
    TASK_FD_QUERY = 20
    MAP_LOOKUP_AND_DELETE_ELEM = 21
    MAP_FREEZE = 22
    BTF_GET_NEXT_ID = 23
    MAP_LOOKUP_BATCH = 24
    LINK_CREATE = 28
    LINK_UPDATE = 29
    LINK_GET_FD_BY_ID = 30
    LINK_GET_NEXT_ID = 31
    ENABLE_STATS = 32
    LINK_DETACH = 34


class MapType(IntEnum):
    HASH = 1
    ARRAY = 2
    PROG_ARRAY = 3
    PERF_EVENT_ARRAY = 4
    PERCPU_HASH = 5
    PERCPU_ARRAY = 6
    STACK_TRACE = 7
    LRU_HASH = 9
    RINGBUF = 27


class ProgType(IntEnum):
    SOCKET_FILTER = 1
    KPROBE = 2
    SCHED_CLS = 3
    TRACEPOINT = 5
    XDP = 6
    RAW_TRACEPOINT = 17
    TRACING = 26


class AttachType(IntEnum):
    NONE = 0
    TRACE_RAW_TP = 23
    TRACE_FENTRY = 24
    TRACE_FEXIT = 25
    MODIFY_RETURN = 26
    PERF_EVENT = 41
    XDP = 37                   # an XDP program on a device (link: 5.9)
    TRACE_KPROBE_MULTI = 42    # 5.18
    TCX_INGRESS = 46           # tc programs through tcx links (6.6)
    TCX_EGRESS = 47
    # tracing-multi links (one fentry/fexit program on many BTF functions): the values in Debian's 7.2 kernel's
    # BTF; bpf.probes.attach_type reads the running kernel's own from its BTF, and only falls back to these
    TRACE_FENTRY_MULTI = 59
    TRACE_FEXIT_MULTI = 60


class LinkType(IntEnum):
    XDP = 6
    KPROBE_MULTI = 8
    TCX = 11
    NETKIT = 13
    TRACING_MULTI = 15


class Helper(IntEnum):
    map_lookup_elem = 1
    map_update_elem = 2
    map_delete_elem = 3
    probe_read = 4
    ktime_get_ns = 5
    trace_printk = 6
    get_prandom_u32 = 7
    get_smp_processor_id = 8
    get_current_pid_tgid = 14
    get_current_uid_gid = 15
    get_current_comm = 16
    perf_event_output = 25
    get_stackid = 27
    get_stack = 67
    skb_load_bytes = 26
    get_current_task = 35
    probe_read_str = 45
    skb_output = 111
    xdp_output = 121
    probe_read_user = 112
    probe_read_kernel = 113
    probe_read_user_str = 114
    probe_read_kernel_str = 115
    get_ns_current_pid_tgid = 120
    ktime_get_boot_ns = 125
    ringbuf_output = 130
    ringbuf_reserve = 131
    ringbuf_submit = 132
    ringbuf_discard = 133
    ringbuf_query = 134
    get_current_task_btf = 158
    get_func_ip = 173
    get_attach_cookie = 174
    get_func_arg = 183
    get_func_ret = 184
    get_func_arg_cnt = 185
    dynptr_read = 201
    dynptr_write = 202
    dynptr_data = 203
    ktime_get_tai_ns = 208


class MapFlags(IntFlag):
    NONE = 0
    NO_PREALLOC = 1 << 0
    RDONLY = 1 << 3
    WRONLY = 1 << 4
    MMAPABLE = 1 << 10


class ProgFlag(IntFlag):
    """BPF_PROG_LOAD's prog_flags."""
    NONE = 0
    XDP_HAS_FRAGS = 1 << 5    # an XDP program that takes multi-buffer packets (Linux 5.18+)


class UpdateFlags(IntEnum):
    ANY = 0
    NOEXIST = 1
    EXIST = 2


# bpf_perf_event_output / bpf_skb_output / bpf_xdp_output flags
F_INDEX_MASK = 0xFFFFFFFF
F_CURRENT_CPU = F_INDEX_MASK

# bpf_get_stackid flags: frames to skip (the low 8 bits), user stack, compare stacks by hash only, replace a bucket's
# stack with another that hashes alike (the old id then names the new stack)
F_SKIP_FIELD_MASK = 0xFF
F_USER_STACK = 1 << 8
F_FAST_STACK_CMP = 1 << 9
F_REUSE_STACKID = 1 << 10

# src_reg of ld_imm64 (what imm is) and of call (what is called)
PSEUDO_MAP_FD = 1
PSEUDO_MAP_VALUE = 2
PSEUDO_CALL = 1          # a BPF-to-BPF call: imm is the callee's offset
PSEUDO_KFUNC_CALL = 2    # a kernel function: imm is its BTF id

STATS_RUN_TIME = 0

# perf_event_open
class PerfType(IntEnum):
    HARDWARE = 0
    SOFTWARE = 1
    TRACEPOINT = 2


PERF_COUNT_SW_BPF_OUTPUT = 10
PERF_SAMPLE_RAW = 1 << 10
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_ATTR_FLAG_WATERMARK = 1 << 14


class PerfRecord(IntEnum):
    LOST = 2
    SAMPLE = 9


class PerfIoctl(IntEnum):
    ENABLE = 0x2400
    DISABLE = 0x2401
    SET_BPF = 0x40042408


BPF_OBJ_NAME_LEN = 16


class Capability(IntEnum):
    """The capabilities BPF tracing needs (linux/capability.h): CAP_BPF and CAP_PERFMON (5.8+), or CAP_SYS_ADMIN
    which stands for both."""

    SYS_ADMIN = 21
    PERFMON = 38
    BPF = 39
