"""Link-layer types: tcpdump's DLT names, pcap LINKTYPE numbers, descriptions, and libpcap's DLT values."""

from __future__ import annotations

from typing import NamedTuple

from fcap.errors import FcapError

# What the link headers fcap makes up say (Linux's if_ether.h and if_packet.h): the protocol and the packet type.
ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
PACKET_HOST = 0
PACKET_OUTGOING = 4


def loaded16(value: int) -> int:
    """What a 16-bit load (little-endian, as the programs run) reads from a big-endian field holding `value`, such
    as skb->protocol."""
    return int.from_bytes(value.to_bytes(2, "big"), "little")


class LinkType(NamedTuple):
    """One link-layer header type as pcap/pcapng files record it (LINKTYPE_* numbering), described as libpcap
    describes it (what tcpdump prints after the name)."""

    name: str  # tcpdump/libpcap name without prefix, e.g. "EN10MB"
    number: int  # LINKTYPE_* value written in pcap/pcapng files
    description: str

    def __str__(self) -> str:
        return f"{self.name} ({self.number}, {self.description})"


class UnknownLinkType(FcapError):
    """A linktype name or number that is not in the table."""

    def __init__(self, text: object) -> None:
        self.text = text
        names = ", ".join(lt.name for lt in COMMON)
        super().__init__(f"unknown linktype {text!r}; use a name such as {names}, or a decimal LINKTYPE number")


_TABLE = (
    LinkType("NULL", 0, "BSD loopback"),
    LinkType("EN10MB", 1, "Ethernet"),
    LinkType("AX25", 3, "AX.25 amateur radio"),
    LinkType("IEEE802", 6, "Token ring"),
    LinkType("ARCNET", 7, "BSD ARCNET"),
    LinkType("SLIP", 8, "SLIP"),
    LinkType("PPP", 9, "PPP"),
    LinkType("FDDI", 10, "FDDI"),
    LinkType("PPP_SERIAL", 50, "PPP over serial"),
    LinkType("PPP_ETHER", 51, "PPPoE"),
    LinkType("ATM_RFC1483", 100, "RFC 1483 LLC-encapsulated ATM"),
    LinkType("RAW", 101, "Raw IP"),
    LinkType("C_HDLC", 104, "Cisco HDLC"),
    LinkType("IEEE802_11", 105, "802.11"),
    LinkType("FRELAY", 107, "Frame Relay"),
    LinkType("LOOP", 108, "OpenBSD loopback"),
    LinkType("ENC", 109, "OpenBSD encapsulated IP"),
    LinkType("LINUX_SLL", 113, "Linux cooked v1"),
    LinkType("PFLOG", 117, "OpenBSD pflog file"),
    LinkType("PRISM_HEADER", 119, "802.11 plus Prism header"),
    LinkType("IP_OVER_FC", 122, "RFC 2625 IP-over-Fibre Channel"),
    LinkType("SUNATM", 123, "Sun raw ATM"),
    LinkType("IEEE802_11_RADIO", 127, "802.11 plus radiotap header"),
    LinkType("ARCNET_LINUX", 129, "Linux ARCNET"),
    LinkType("IEEE802_11_RADIO_AVS", 163, "802.11 plus AVS radio information header"),
    LinkType("BLUETOOTH_HCI_H4", 187, "Bluetooth HCI UART transport layer"),
    LinkType("USB_LINUX", 189, "USB with Linux header"),
    LinkType("PPI", 192, "Per-Packet Information"),
    LinkType("IEEE802_15_4_WITHFCS", 195, "IEEE 802.15.4 with FCS"),
    LinkType("BLUETOOTH_HCI_H4_WITH_PHDR", 201, "Bluetooth HCI UART transport layer plus pseudo-header"),
    LinkType("USB_LINUX_MMAPPED", 220, "USB with padded Linux header"),
    LinkType("CAN_SOCKETCAN", 227, "CAN-bus with SocketCAN headers"),
    LinkType("IPV4", 228, "Raw IPv4"),
    LinkType("IPV6", 229, "Raw IPv6"),
    LinkType("IEEE802_15_4_NOFCS", 230, "IEEE 802.15.4 without FCS"),
    LinkType("NFLOG", 239, "Linux netfilter log messages"),
    LinkType("USBPCAP", 249, "USB with USBPcap header"),
    LinkType("NETLINK", 253, "Linux netlink"),
    LinkType("VSOCK", 271, "Linux vsock"),
    LinkType("ETHERNET_MPACKET", 274, "802.3br mPackets"),
    LinkType("LINUX_SLL2", 276, "Linux cooked v2"),
)

_BY_NAME = {lt.name: lt for lt in _TABLE}
_BY_NUMBER = {lt.number: lt for lt in _TABLE}
# Aliases tcpdump/libpcap/Wireshark users type.
_ALIASES = {
    "ETHERNET": "EN10MB",
    "IEEE802_11_RADIOTAP": "IEEE802_11_RADIO",
    "RADIOTAP": "IEEE802_11_RADIO",
    "SLL": "LINUX_SLL",
    "SLL2": "LINUX_SLL2",
    "PPP_HDLC": "PPP_SERIAL",
    "IEEE802_15_4": "IEEE802_15_4_WITHFCS",
    "LINUX_SOCKETCAN": "CAN_SOCKETCAN",
}

COMMON = tuple(_BY_NAME[n] for n in ("EN10MB", "RAW", "IPV4", "IPV6", "LINUX_SLL", "LINUX_SLL2", "NULL", "LOOP",
                                     "IEEE802_11", "IEEE802_11_RADIO"))

EN10MB = _BY_NAME["EN10MB"]
RAW = _BY_NAME["RAW"]
IPV4 = _BY_NAME["IPV4"]
IPV6 = _BY_NAME["IPV6"]
LINUX_SLL = _BY_NAME["LINUX_SLL"]
LINUX_SLL2 = _BY_NAME["LINUX_SLL2"]
NULL = _BY_NAME["NULL"]
LOOP = _BY_NAME["LOOP"]
IEEE802_11 = _BY_NAME["IEEE802_11"]
IEEE802_11_RADIO = _BY_NAME["IEEE802_11_RADIO"]

# A file's LINKTYPE value 12: libpcap on Linux reads it as its DLT_RAW (values below 104 are read as the DLT of the
# same value), and tcpdump prints it as RAW. (14 is OpenBSD's DLT_RAW: tcpdump on Linux does not know it.)
LINUX_DLT_RAW = 12
# Ethernet types of a VLAN tag (802.1Q, 802.1ad, and the older QinQ types tcpdump knows).
VLAN_TPIDS = (0x8100, 0x88A8, 0x9100, 0x9200)
# How the network layer follows the link-layer header, for the link types fcap decodes: the printer and --json
# (fcap.text.dissect.link) and --nft's matching of a drop to its trace (network_header) read this one table.
# Ethernet; raw IP (the version nibble says IPv4 or IPv6, as tcpdump reads all of them); Linux cooked v1 and v2;
# the BSD loopbacks' 4-byte address family.
FRAMING = {EN10MB.number: "ethernet", RAW.number: "raw", IPV4.number: "raw", IPV6.number: "raw",
           LINUX_DLT_RAW: "raw", LINUX_SLL.number: "sll", LINUX_SLL2.number: "sll2", NULL.number: "null",
           LOOP.number: "null"}

# LINKTYPE -> DLT where libpcap's DLT value differs from the file's LINKTYPE value (libpcap on Linux).
_DLT_DIFFERS = {101: 12, 100: 11, 102: 15, 103: 16}


def all_linktypes() -> tuple[LinkType, ...]:
    """Every linktype in the table, ordered by number."""
    return _TABLE


def lookup(text: str | int) -> LinkType:
    """A linktype by name (any case, optional DLT_/LINKTYPE_ prefix) or decimal LINKTYPE number."""
    if isinstance(text, int) and not isinstance(text, bool):
        try:
            return _BY_NUMBER[text]
        except KeyError:
            raise UnknownLinkType(text) from None
    if not isinstance(text, str):
        raise UnknownLinkType(text)
    s = text.strip()
    if s.isdigit() and s.isascii():
        try:
            return _BY_NUMBER[int(s)]
        except KeyError:
            raise UnknownLinkType(text) from None
    key = s.upper().replace("-", "_")
    for prefix in ("DLT_", "LINKTYPE_"):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    key = _ALIASES.get(key, key)
    try:
        return _BY_NAME[key]
    except KeyError:
        raise UnknownLinkType(text) from None


def framing(number: int) -> str | None:
    """How the link type `number` carries the network layer (FRAMING); None where fcap does not decode it."""
    return FRAMING.get(number)


def network_header(data: bytes, linktype: int) -> bytes:
    """A frame's bytes from its network header on, by its link type's FRAMING (Ethernet's VLAN tags skipped);
    b"" for a link type fcap does not decode or a frame too short for its link-layer header."""
    how = FRAMING.get(linktype)
    if how == "ethernet" and len(data) >= 14:
        off, etype = 14, int.from_bytes(data[12:14], "big")
        while etype in VLAN_TPIDS and len(data) >= off + 4:
            etype, off = int.from_bytes(data[off + 2:off + 4], "big"), off + 4
        return data[off:]
    return data[_LINK_HEADER[how]:] if how in _LINK_HEADER and len(data) >= _LINK_HEADER[how] else b""


_LINK_HEADER = {"raw": 0, "sll": 16, "sll2": 20, "null": 4}   # (bytes: a fixed link-layer header's length)


def name_of(number: int) -> str:
    """The table name for a LINKTYPE number, or "LINKTYPE_<n>" when it is not in the table."""
    lt = _BY_NUMBER.get(number)
    return lt.name if lt is not None else f"LINKTYPE_{number}"


def dlt_for_libpcap(linktype: int | LinkType) -> int:
    """The DLT value libpcap's filter compiler wants for a LINKTYPE (on Linux RAW is DLT 12, not 101)."""
    number = linktype.number if isinstance(linktype, LinkType) else int(linktype)
    return _DLT_DIFFERS.get(number, number)


def linktype_from_dlt(dlt: int) -> int:
    """The LINKTYPE number to write in a file for a libpcap DLT value (inverse of dlt_for_libpcap)."""
    for lt, d in _DLT_DIFFERS.items():
        if d == dlt:
            return lt
    return dlt
