"""--mirror NAME: an interface on which every captured packet appears, for `tcpdump -i NAME`, `tshark -i NAME` and
any libpcap program. It is a TAP device (Ethernet frames) or a TUN device (raw IP) that fcap holds open, so the
kernel removes it when fcap exits, killed too. Each packet is *sent* on it through an AF_PACKET socket: the
device's taps (libpcap's) see it going out, then the device hands it to fcap's open file, which reads it back and
throws it away. A packet going out of a TUN/TAP device never enters a network stack: nothing delivers, forwards or
answers it. The device has no address, IPv6 off and no ARP, so it sends nothing of its own. The capture programs
leave the device's own packets out (fcap.kernel.predicates.not_device), so nothing loops."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct

from fcap.errors import CaptureError, UsageError

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_TAP, IFF_NO_PI = 0x0001, 0x0002, 0x1000
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP, IFF_NOARP = 0x1, 0x80
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
EN10MB, RAW, IPV4, IPV6, LINUX_SLL2 = 1, 101, 228, 229, 276
TAP_TYPES = (EN10MB, LINUX_SLL2)   # LINUX_SLL2: its packets framed as Ethernet (zero destination, SLL2's source)
TUN_TYPES = (RAW, IPV4, IPV6)
DRAIN_EVERY = 64   # packets sent between reads of what the device queued for fcap


class Mirror:
    """The device NAME for packets of link type `linktype` (a LINKTYPE_ number); send() puts one on it."""

    def __init__(self, name: str, linktype: int):
        if linktype not in TAP_TYPES + TUN_TYPES:
            raise UsageError(f"--mirror: link type {linktype} cannot be mirrored (EN10MB, LINUX_SLL2, RAW, IPV4 and "
                             "IPV6 can: -y)")
        if not name or len(name.encode()) > 15 or "/" in name or name != name.strip():
            raise UsageError(f"--mirror {name!r}: an interface name of 1 to 15 bytes")
        if os.path.exists(f"/sys/class/net/{name}"):
            raise UsageError(f"--mirror {name}: an interface of that name exists (fcap's mirrors go away with it)")
        self.name, self.linktype = name, linktype
        self.tap = linktype in TAP_TYPES
        self.sent = self.failed = 0
        self.fd = self.sock = None
        try:
            self._create()
        except OSError as e:
            self.close()
            raise CaptureError(f"--mirror {name}: {e.strerror or e}") from None

    def _create(self) -> None:
        self.fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        kind = (IFF_TAP if self.tap else IFF_TUN) | IFF_NO_PI
        fcntl.ioctl(self.fd, TUNSETIFF, struct.pack("16sH22x", self.name.encode(), kind))
        try:   # (before it is up: no IPv6 link-local address, no router solicitation)
            with open(f"/proc/sys/net/ipv6/conf/{self.name}/disable_ipv6", "w") as f:
                f.write("1")
        except OSError:
            pass
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", self.name.encode(), 0))
            flags = struct.unpack_from("16sH", ifr)[1] | IFF_UP | IFF_NOARP
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", self.name.encode(), flags))
        self.ifindex = socket.if_nametoindex(self.name)
        self.netns = os.stat("/proc/self/ns/net").st_ino
        if self.tap:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self.sock.bind((self.name, 0))
        else:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0)
        self.sock.setblocking(False)

    def send(self, data: bytes) -> None:
        """One packet of the capture's link type, sent on the device (a packet the device cannot take, one it
        has no room for: counted in `failed`)."""
        if self.sent % DRAIN_EVERY == DRAIN_EVERY - 1:
            self.drain()
        try:
            if self.tap:
                self.sock.send(data if self.linktype == EN10MB else _sll2_as_ethernet(data))
            else:
                version = data[0] >> 4 if data else 0
                proto = ETH_P_IP if version == 4 else ETH_P_IPV6 if version == 6 else 0
                if not proto:
                    self.failed += 1
                    return
                self.sock.sendto(data, (self.name, proto))
            self.sent += 1
        except OSError as e:
            if e.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.EMSGSIZE, errno.EINVAL, errno.ENETDOWN):
                raise
            self.failed += 1
            self.drain()

    def drain(self) -> None:
        """Read back (and drop) what the device queued for fcap's file: the packets sent on it."""
        while True:
            try:
                if not os.read(self.fd, 65536 + 4):
                    return
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return

    def close(self) -> None:
        """The device goes away with fcap's file (a TUN/TAP device not made persistent)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _sll2_as_ethernet(data: bytes) -> bytes:
    """A LINUX_SLL2 packet as an Ethernet frame: no destination, SLL2's source address (where it holds 6 bytes)
    and protocol, then the payload after SLL2's 20 bytes."""
    if len(data) < 20:
        return data
    src = data[12:18] if data[11] == 6 else bytes(6)
    return bytes(6) + src + data[0:2] + data[20:]
