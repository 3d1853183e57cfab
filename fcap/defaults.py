"""The defaults and limits several floors share, each written once: the command line (its help text too), the
API, the session, the writers, the readers and the program builder take them from here. It imports only
fcap.errors, so every floor imports it downward."""

from __future__ import annotations

from fcap.errors import UsageError

SNAPLEN = 262144          # tcpdump's MAXIMUM_SNAPLEN: -s's default (and what -s 0 means), the largest record the
                          # file rings hold, the largest caplen a file reader or printer trusts
SNAPLEN_LIMIT = 0x7FFFFFFF   # the largest -s a capture takes (the program's length compares are signed 32-bit)
BUFFER_KIB_PER_CPU = 2048   # -B's default: the capture buffer, KiB, all CPUs together, is this much per CPU ...
BUFFER_KIB_MAX = 131072     # ... up to this much in all, each CPU keeping at least BUFFER_KIB_CPU_MIN
BUFFER_KIB_CPU_MIN = 1024
PCAPNG_BUFFER = 2           # ... times this for a pcapng file (its blocks are larger: about as many records)
TRACK_MAX = 16384         # --track-max: entries of the tracking map (two per packet, one more per clone)
FILE_BUFFERING = 1 << 20  # bytes an output file buffers before it writes
NS = 1_000_000_000        # nanoseconds in a second: timestamps are integer ns everywhere
POLL_MS = 100             # how long a drain waits for records before it looks again (at what may stop it)
POLL_MS_IMMEDIATE = 5     # ... with --immediate-mode (printing, the API): records as soon as they are published
BLOCK_CACHE_MAX = 1 << 14   # pcapng block options a perf buffer's drain keeps made, by metadata key (both walks) ...
BLOCK_CACHE_BYTES = 32 << 20   # ... and their bytes and keys' at most (a --dump of whole structures: KiBs a key)
CTX_ENTRIES = 4096   # --context into the file rings: (cgroup, netns) pairs whose names the programs hold at once
NFT_TEXTS = 4096     # --nft: rules whose names the programs and the trace socket's filter hold
DUMP_TEXTS = 512     # --dump into the file rings: distinct dumps whose options the programs hold (4 KiB each)
DROP_TEXTS = 4096    # drop points into the file rings: (reason, location) pairs whose names the programs hold
FILE_BATCH = 8192    # packets a batch of a file read in batches (-r, fcap.read, fcap.batches): columns stay in cache


def buffer_kib(cpus: int, pcapng: bool = False) -> int:
    """-B's default on a machine with `cpus` CPUs: 2 MiB per CPU (4 MiB on 2 CPUs, 32 MiB on 16) up to 128 MiB in
    all, and never less than 1 MiB per CPU (128 CPUs: 1 MiB each); twice that for `pcapng` blocks, which with their
    options and comment are ~2.5 times a pcap record: the same records a CPU's share holds either way."""
    cpus = max(cpus, 1)
    kib = max(min(BUFFER_KIB_PER_CPU * cpus, BUFFER_KIB_MAX), BUFFER_KIB_CPU_MIN * cpus)
    return kib * PCAPNG_BUFFER if pcapng else kib


def check_snaplen(snaplen: int, given: object = None) -> int:
    """snaplen when a capture can take it, else UsageError saying why (`given`: as the user wrote it)."""
    shown = snaplen if given is None else given
    if snaplen < 1:
        raise UsageError(f"invalid snaplen '{shown}': must be at least 1")
    if snaplen > SNAPLEN_LIMIT:
        raise UsageError(f"invalid snaplen '{shown}': too large")
    return snaplen
