"""Tests of bpf.btf: small blobs built here, then the running kernel's BTF against bpftool's view of it."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from functools import cache

import pytest

from bpf.btf import BTF, BTFError, Const, Enum64, Func, FuncProto, Int, Ptr, Struct, Typedef, Union, c_decl

VMLINUX = "/sys/kernel/btf/vmlinux"
KINDS = {k: i for i, k in enumerate(
    "int ptr array struct union enum fwd typedef volatile const restrict func func_proto var datasec float "
    "decl_tag type_tag enum64".split(), 1)}


class Enc:
    """A tiny BTF encoder: add types, get their ids, then `blob()`; `base` makes a split BTF on top of it."""

    def __init__(self, base: Enc | None = None, endian: str = "<"):
        self.base, self.e = base, endian
        self.first = base.next_id if base else 1
        self.str_first = base.str_first + len(base.strs) if base else 0
        self.strs = bytearray() if base else bytearray(b"\0")  # like libbpf, split strings start at once
        self.recs: list[bytes] = []

    @property
    def next_id(self) -> int:
        return self.first + len(self.recs)

    def s(self, name: str) -> int:
        if not name:
            return 0
        if self.base is not None:
            found = self.base.find_str(name)
            if found is not None:
                return found
        found = self.find_str(name)
        if found is not None:
            return found
        self.strs += name.encode() + b"\0"
        return self.str_first + len(self.strs) - len(name) - 1

    def find_str(self, name: str) -> int | None:
        pos = (b"\0" + bytes(self.strs)).find(b"\0" + name.encode() + b"\0")
        return None if pos < 0 else self.str_first + pos

    def add(self, kind: str, name: str, vlen: int, size_or_type: int, *extra: int, kflag: int = 0) -> int:
        info = (kflag << 31) | (KINDS[kind] << 24) | vlen
        self.recs.append(struct.pack(f"{self.e}3I{len(extra)}I", self.s(name), info, size_or_type, *extra))
        return self.next_id - 1

    def int(self, name, size, bits=None, signed=False, char=False, boolean=False, offset=0):
        enc = signed | char << 1 | boolean << 2
        return self.add("int", name, 0, size, enc << 24 | offset << 16 | (size * 8 if bits is None else bits))

    def ref(self, kind, target, name=""):
        return self.add(kind, name, 0, target)

    def array(self, elem, index, n):
        return self.add("array", "", 0, 0, elem, index, n)

    def struct(self, name, size, members, union=False):
        """members: (name, type, bit_offset[, bitfield_size])."""
        kflag = int(any(len(m) > 3 and m[3] for m in members))
        words = [w for m in members for w in (self.s(m[0]), m[1], (m[3] << 24 if kflag and len(m) > 3 else 0) | m[2])]
        return self.add("union" if union else "struct", name, len(members), size, *words, kflag=kflag)

    def enum(self, name, values, size=4, signed=False, wide=False):
        words = []
        for n, v in values:
            v &= (1 << (64 if wide else 32)) - 1
            words += [self.s(n), v & 0xFFFFFFFF] + ([v >> 32] if wide else [])
        return self.add("enum64" if wide else "enum", name, len(values), size, *words, kflag=int(signed))

    def fwd(self, name, union=False):
        return self.add("fwd", name, 0, 0, kflag=int(union))

    def proto(self, ret, params):
        return self.add("func_proto", "", len(params), ret, *[w for n, t in params for w in (self.s(n), t)])

    def func(self, name, proto, linkage=1):
        return self.add("func", name, linkage, proto)

    def blob(self, magic: int = 0xEB9F) -> bytes:
        types, strs = b"".join(self.recs), bytes(self.strs)
        hdr = struct.pack(f"{self.e}HBBIIIII", magic, 1, 0, 24, 0, len(types), len(types), len(strs))
        return hdr + types + strs

    def load(self, base: BTF | None = None, name: str = "") -> BTF:
        return BTF.load(self.blob(), base, name)


def sample(endian: str = "<") -> tuple[Enc, dict[str, int]]:
    """A little kernel: ints, struct sk_buff with bitfields and an anonymous union, funcs, a tracepoint typedef."""
    e, ids = Enc(endian=endian), {}
    ids["uint"] = e.int("unsigned int", 4)
    ids["int"] = e.int("int", 4, signed=True)
    ids["char"] = e.int("char", 1, char=True, signed=True)
    ids["u8"] = e.int("unsigned char", 1)
    ids["u16"] = e.ref("typedef", e.int("short unsigned int", 2), "__u16")
    ids["be16"] = e.ref("typedef", ids["u16"], "__be16")
    ids["void_ptr"] = e.ref("ptr", 0)
    ids["cchar_ptr"] = e.ref("ptr", e.ref("const", ids["char"]))
    ids["net"] = e.struct("net", 8, [("ifindex", ids["int"], 0)])
    ids["net_ptr"] = e.ref("ptr", ids["net"])
    anon = e.struct("", 4, [("mac_header", ids["u16"], 0), ("network_header", ids["u16"], 16)])
    union = e.struct("", 4, [("", anon, 0), ("headers", ids["uint"], 0)], union=True)
    name16 = e.array(ids["char"], ids["uint"], 16)
    ids["sk_buff"] = e.struct("sk_buff", 48, [
        ("len", ids["uint"], 0), ("data_len", ids["uint"], 32),
        ("cloned", ids["u8"], 64, 1), ("nohdr", ids["u8"], 65, 1), ("fclone", ids["u8"], 66, 2),
        ("", union, 96), ("protocol", ids["be16"], 128), ("name", name16, 144),
        ("head", ids["cchar_ptr"], 320), ("data", ids["cchar_ptr"], 384)])
    ids["skb_ptr"] = e.ref("ptr", ids["sk_buff"])
    ids["p_ip_send_skb"] = e.proto(ids["int"], [("net", ids["net_ptr"]), ("skb", ids["skb_ptr"])])
    ids["ip_send_skb"] = e.func("ip_send_skb", ids["p_ip_send_skb"])
    const_skb = e.ref("const", ids["sk_buff"])
    skb_t = e.ref("typedef", e.ref("ptr", const_skb), "skb_t")   # typedef const struct sk_buff *skb_t
    ids["skb_cmp"] = e.func("skb_cmp", e.proto(ids["int"], [("a", skb_t), ("n", ids["int"]), ("b", ids["skb_ptr"])]))
    ids["skb_pp"] = e.func("skb_pp", e.proto(0, [("pp", e.ref("ptr", ids["skb_ptr"]))]))   # struct sk_buff **: no
    ids["printk"] = e.func("printk", e.proto(ids["int"], [("fmt", ids["cchar_ptr"]), ("", 0)]))
    ids["noargs"] = e.func("noargs", e.proto(ids["void_ptr"], []), linkage=0)
    union_skb = e.struct("sk_buff", 4, [("x", ids["int"], 0)], union=True)
    e.func("takes_union", e.proto(0, [("u", e.ref("ptr", union_skb))]))            # union sk_buff *: no
    fn = e.ref("ptr", e.proto(ids["int"], [("", ids["int"])]))
    ids["tp"] = e.ref("typedef", e.ref("ptr", e.proto(0, [("", ids["void_ptr"]), ("", ids["skb_ptr"])])),
                      "btf_trace_net_dev_queue")
    e.ref("typedef", fn, "btf_trace_not_a_tracepoint_but_fn")
    e.ref("typedef", ids["int"], "btf_trace_plain")                                  # not a pointer: no
    ids["fn"] = fn
    ids["color"] = e.enum("color", [("RED", 0), ("GREEN", 1), ("NEG", -1)], signed=True)
    ids["big"] = e.enum("big", [("HUGE", 1 << 40), ("MINUS", -2)], size=8, signed=True, wide=True)
    ids["ubig"] = e.enum("ubig", [("TOP", (1 << 64) - 1)], size=8, wide=True)
    ids["fwd_sock"] = e.fwd("sock")
    ids["var"] = e.add("var", "jiffies", 0, ids["uint"], 1)
    ids["sec"] = e.add("datasec", ".data", 1, 64, ids["var"], 8, 4)
    ids["double"] = e.add("float", "double", 0, 8)
    ids["tag"] = e.add("decl_tag", "noinline", 0, ids["ip_send_skb"], 0xFFFFFFFF)
    ids["user_ptr"] = e.ref("ptr", e.ref("type_tag", ids["char"], "user"))
    return e, ids


@pytest.fixture(scope="module")
def small():
    e, ids = sample()
    return e.load(name="small"), ids


# -- small blobs --------------------------------------------------------------------------------------------


def test_ints_and_sizes(small):
    btf, ids = small
    u, i, c = btf.type(ids["uint"]), btf.type(ids["int"]), btf.type(ids["char"])
    assert isinstance(u, Int) and u.kind == "int" and u.size == 4 and u.bits == 32 and not u.signed
    assert i.signed and not i.char and c.char and c.signed and c.size == 1
    assert btf.type(0).kind == "void" and btf.type(0).name == ""
    assert btf.type(ids["void_ptr"]).size == 8
    assert btf.type(ids["be16"]).size == 2 and btf.type(ids["be16"]).strip().name == "short unsigned int"
    assert btf.type(ids["sk_buff"]).size == 48
    assert btf.type(ids["sec"]).vars[0].type.name == "jiffies" and btf.type(ids["var"]).linkage == "global"
    assert btf.type(ids["double"]).kind == "float" and btf.type(ids["double"]).size == 8
    tag = btf.type(ids["tag"])
    assert tag.kind == "decl_tag" and tag.component_idx == -1 and tag.target.name == "ip_send_skb"
    assert btf.type(ids["fwd_sock"]).kind == "fwd" and not btf.type(ids["fwd_sock"]).is_union
    with pytest.raises(BTFError):
        btf.type(ids["ip_send_skb"]).size
    assert len(btf) == max(ids.values()) + 1 and btf.type(ids["int"]) is btf.type(ids["int"])


def test_members_bitfields_and_anonymous(small):
    btf, ids = small
    skb = btf.find("sk_buff", "struct")
    assert isinstance(skb, Struct) and skb.id == ids["sk_buff"]
    names = [m.name for m in skb.members]
    assert names[:5] == ["len", "data_len", "cloned", "nohdr", "fclone"] and "" in names
    fclone, off = skb.member("fclone")
    assert (fclone.bit_offset, fclone.bitfield_size, off) == (66, 2, 66)
    assert skb.member("len")[0].bitfield_size == 0 and skb.member("data_len")[1] == 32
    assert skb.member("headers")[1] == 96                       # in the anonymous union
    mac, off = skb.member("network_header")                     # anonymous struct in the anonymous union
    assert off == 96 + 16 and mac.type.name == "__u16" and mac.offset == 2
    assert skb.member("protocol")[0].type.strip().size == 2
    assert skb.member_path("name")[1] == 144
    with pytest.raises(BTFError, match=r"struct sk_buff\.nosuch"):
        skb.member("nosuch")
    with pytest.raises(BTFError, match="not a struct"):
        skb.member_path("len.x")
    net = btf.find("net")
    assert net.member_path("ifindex") == (net.members[0], 0)


def test_enums(small):
    btf, ids = small
    color = btf.find("color", "enum")
    assert color.signed and color.values == {"RED": 0, "GREEN": 1, "NEG": -1} and color.name_of(1) == "GREEN"
    big = btf.type(ids["big"])
    assert isinstance(big, Enum64) and big.kind == "enum64" and big.values == {"HUGE": 1 << 40, "MINUS": -2}
    assert btf.type(ids["ubig"]).values == {"TOP": (1 << 64) - 1} and btf.type(ids["ubig"]).name_of(3) is None


def test_c_decl(small):
    btf, ids = small
    t = btf.type
    assert c_decl(t(ids["skb_ptr"]), "skb") == "struct sk_buff *skb"
    assert c_decl(t(ids["cchar_ptr"]), "name") == "const char *name"
    assert c_decl(t(ids["uint"]), "len") == "unsigned int len"
    assert c_decl(t(ids["fn"]), "fn") == "int (*fn)(int)"
    assert c_decl(t(ids["sk_buff"]).member("name")[0].type, "name") == "char name[16]"
    assert c_decl(t(ids["skb_ptr"])) == "struct sk_buff *" and c_decl(t(ids["uint"])) == "unsigned int"
    assert c_decl(t(ids["color"]), "c") == "enum color c" and c_decl(t(ids["big"])) == "enum big"
    assert c_decl(t(ids["fwd_sock"]), "sk") == "struct sock sk" and c_decl(t(0)) == "void"
    assert c_decl(t(ids["tp"]).target, "tp") == "void (*tp)(void *, struct sk_buff *)"
    assert c_decl(t(ids["user_ptr"]), "p") == 'char __attribute__((btf_type_tag("user"))) *p'
    assert c_decl(t(ids["var"])) == "unsigned int jiffies"


def test_c_decl_declarators():
    e = Enc()
    i = e.int("int", 4, signed=True)
    arr = e.array(i, i, 4)
    cases = {
        e.ref("ptr", arr): "int (*x)[4]",
        e.array(e.ref("ptr", i), i, 3): "int *x[3]",
        e.array(arr, i, 2): "int x[2][4]",
        e.ref("const", e.ref("ptr", e.struct("s", 0, []))): "struct s * const x",
        e.ref("ptr", e.ref("volatile", i)): "volatile int *x",
        e.ref("ptr", e.ref("ptr", e.ref("ptr", i))): "int ***x",
        e.ref("ptr", e.proto(e.ref("ptr", i), [("", i)])): "int * (*x)(int)",
        e.ref("ptr", e.proto(0, [])): "void (*x)(void)",
        e.ref("ptr", e.proto(i, [("a", i), ("", 0)])): "int (*x)(int a, ...)",
        e.array(e.ref("ptr", e.proto(i, [])), i, 2): "int (*x[2])(void)",
        e.ref("ptr", e.struct("", 0, [])): "struct {} *x",
        e.ref("ptr", e.struct("", 4, [("a", i, 0)], union=True)): "union {...} *x",
        e.ref("ptr", e.fwd("u", union=True)): "union u *x",
        e.ref("restrict", e.ref("ptr", i)): "int * restrict x",
    }
    btf = e.load()
    for tid, want in cases.items():
        assert c_decl(btf.type(tid), "x") == want
        assert c_decl(btf.type(tid), "x") == want                  # cached path gives the same


def test_prototypes(small):
    btf, ids = small
    f = btf.find("ip_send_skb", "func")
    assert isinstance(f, Func) and f.linkage == "global" and f.proto.ret.name == "int"
    assert c_decl(f) == "int ip_send_skb(struct net *net, struct sk_buff *skb)"
    assert [(p.name, p.type.kind) for p in f.proto.params] == [("net", "ptr"), ("skb", "ptr")]
    printk = btf.find("printk")
    assert printk.proto.variadic and len(printk.proto.params) == 1
    assert c_decl(printk) == "int printk(const char *fmt, ...)"
    noargs = btf.find("noargs")
    assert c_decl(noargs) == "void *noargs(void)" and noargs.linkage == "static"
    assert not noargs.proto.variadic and noargs.proto.params == []


def test_find(small):
    btf, ids = small
    assert btf.find("sk_buff").id == ids["sk_buff"]                 # the struct comes first
    assert [t.kind for t in btf.find_all("sk_buff")] == ["struct", "union"]
    assert btf.find("sk_buff", "union").kind == "union"
    assert btf.find("sk_buff", "func") is None and btf.find("sk_buf") is None and btf.find("k_buff") is None
    assert btf.find("") is None and btf.find("__u16", "typedef").id == ids["u16"]
    with pytest.raises(BTFError, match="unknown kind"):
        btf.find("x", "structure")
    assert [f.name for f in btf.funcs()][:3] == ["ip_send_skb", "skb_cmp", "skb_pp"]
    assert all(isinstance(t, Typedef) for t in btf.types("typedef"))
    for _ in range(40):                                                 # past the switch to a full index
        assert btf.find("int", "int").id == ids["int"]


def test_funcs_taking_pointer_to(small):
    btf, ids = small
    found = {f.name: idx for f, idx in btf.funcs_taking_pointer_to("sk_buff")}
    assert found == {"ip_send_skb": [1], "skb_cmp": [0, 2]}
    assert btf.funcs_taking_pointer_to("net") == [(btf.find("ip_send_skb"), [0])]
    assert btf.funcs_taking_pointer_to("nosuch") == [] and btf.funcs_taking_pointer_to("color") == []


def test_typedefs_to_func_proto(small):
    btf, ids = small
    got = dict(btf.typedefs_to_func_proto("btf_trace_"))
    assert set(got) == {"btf_trace_net_dev_queue", "btf_trace_not_a_tracepoint_but_fn"}
    proto = got["btf_trace_net_dev_queue"]
    assert isinstance(proto, FuncProto) and [c_decl(p.type) for p in proto.params] == ["void *", "struct sk_buff *"]
    assert btf.typedefs_to_func_proto("nosuch_") == []


def test_split():
    be, bids = sample()
    base = be.load(name="base")
    e = Enc(be)
    own_int = e.int("int", 4, signed=True)                     # a name whose string is in the base
    dev = e.struct("net_device", 8, [("ifindex", own_int, 0)])
    p_xmit = e.proto(bids["int"], [("skb", bids["skb_ptr"]), ("dev", e.ref("ptr", dev))])
    e.func("mod_xmit", p_xmit)
    e.func("mod_rcv", bids["p_ip_send_skb"])                   # a FUNC_PROTO of the base
    e.func("mod_other", e.proto(0, [("d", e.ref("ptr", dev))]))
    e.func("mod_const", e.proto(0, [("d", dev), ("skb", e.ref("ptr", e.ref("const", bids["sk_buff"])))]))
    e.ref("typedef", e.ref("ptr", e.proto(0, [("", bids["void_ptr"]), ("", bids["skb_ptr"])])), "btf_trace_mod_tp")
    mod = e.load(base, "mod")
    assert mod.base is base and mod.name == "mod" and len(mod) == e.next_id and mod.ids().start == len(base)
    assert mod.type(bids["sk_buff"]) is base.type(bids["sk_buff"]) and mod.type(0).kind == "void"
    assert mod.type(own_int).name == "int" and mod.type(dev).member("ifindex")[0].type.id == own_int
    assert [t.id for t in mod.find_all("int")] == [bids["int"], own_int]
    assert mod.find("net_device").id == dev and base.find("net_device") is None
    assert [f.name for f in mod.funcs()] == ["mod_xmit", "mod_rcv", "mod_other", "mod_const"]
    want = {"mod_xmit": [0], "mod_rcv": [1], "mod_const": [1]}
    for _ in range(2):                                          # again: from what the base remembered
        assert {f.name: i for f, i in mod.funcs_taking_pointer_to("sk_buff")} == want
    assert {f.name for f, _ in base.funcs_taking_pointer_to("sk_buff")} == {"ip_send_skb", "skb_cmp"}
    assert [f.name for f, _ in mod.funcs_taking_pointer_to("net_device")] == ["mod_xmit", "mod_other"]
    assert [n for n, _ in mod.typedefs_to_func_proto("btf_trace_")] == ["btf_trace_mod_tp"]
    assert c_decl(mod.find("mod_xmit")) == "int mod_xmit(struct sk_buff *skb, struct net_device *dev)"
    assert mod.kind_of(dev) == "struct" and mod.kind_of(bids["sk_buff"]) == "struct" and mod.kind_of(0) == "void"
    with pytest.raises(BTFError, match="out of range"):
        mod.type(len(mod))


def test_split_first_string():
    be, _ = sample()
    e = Enc(be)
    e.struct("first_string", 0, [])          # its name is the first string of the split section, at no NUL
    mod = e.load(be.load())
    assert mod.find("first_string").name == "first_string"


def test_big_endian():
    e, ids = sample(">")
    btf = e.load()
    assert c_decl(btf.find("ip_send_skb")) == "int ip_send_skb(struct net *net, struct sk_buff *skb)"
    assert btf.find("sk_buff").member("fclone")[0].bitfield_size == 2
    assert btf.find("big").values["HUGE"] == 1 << 40
    assert {f.name for f, _ in btf.funcs_taking_pointer_to("sk_buff")} == {"ip_send_skb", "skb_cmp"}


def test_legacy_int_bitfield():
    e = Enc()
    u = e.int("unsigned int", 4)
    bf = e.int("unsigned int", 4, bits=3, offset=2)
    s = e.struct("s", 4, [("a", u, 0), ("b", bf, 0)])
    m, off = e.load().type(s).member("b")
    assert (m.bitfield_size, m.bit_offset, off) == (3, 2, 2)


def test_errors():
    e, _ = sample()
    good = e.blob()
    with pytest.raises(BTFError, match="bad magic 0x1234"):
        BTF.load(b"\x34\x12" + good[2:], name="foo")
    with pytest.raises(BTFError, match="parse foo"):
        BTF.load(b"\x34\x12" + good[2:], name="foo")
    with pytest.raises(BTFError, match="truncated"):
        BTF.load(good[:10])
    with pytest.raises(BTFError, match="truncated"):
        BTF.load(good[:-1])
    hdr = list(struct.unpack_from("<HBBIIIII", good))
    hdr[5] -= 4                                                   # type section ends inside a record
    with pytest.raises(BTFError, match="truncated record"):
        BTF.load(struct.pack("<HBBIIIII", *hdr) + good[24:])
    bad_kind = Enc()
    bad_kind.recs.append(struct.pack("<3I", 0, 25 << 24, 0))
    with pytest.raises(BTFError, match="unknown kind 25"):
        bad_kind.load()
    bad_str = Enc()
    bad_str.recs.append(struct.pack("<3I", 999, 2 << 24, 0))
    with pytest.raises(BTFError, match="offset 999"):
        bad_str.load().type(1)
    loop = Enc()
    loop.recs.append(struct.pack("<3I", 0, 10 << 24, 1))          # const of itself
    with pytest.raises(BTFError, match="loop"):
        loop.load().type(1).strip()
    with pytest.raises(BTFError, match="loop"):
        c_decl(loop.load().type(1), "x")
    with pytest.raises(BTFError, match="out of range"):
        e.load().type(10_000)
    with pytest.raises(BTFError, match="not a module name"):
        BTF.module("../vmlinux")
    with pytest.raises(BTFError, match="read /nonexistent"):
        BTF.load_file("/nonexistent")


def test_corrupt_blobs_raise_only_btferror():
    e, _ = sample()
    good = e.blob()
    blobs = [good[:n] for n in range(0, len(good), 7)]
    blobs += [good[:k] + bytes([good[k] ^ x]) + good[k + 1:] for k in range(24, len(good), 5) for x in (0x1F, 0x80)]
    for blob in blobs:
        try:
            btf = BTF.load(blob)
            for i in range(len(btf)):
                t = btf.type(i)
                repr(t), t.kind, t.strip()
                if isinstance(t, (Struct, Union)):
                    t.members
                if isinstance(t, FuncProto):
                    t.params
                c_decl(t, "x")
        except BTFError:
            pass


# -- the running kernel, checked against bpftool ---------------------------------------------------------

needs_vmlinux = pytest.mark.skipif(not os.path.exists(VMLINUX), reason=f"{VMLINUX} is absent (kernel without BTF)")
needs_bpftool = pytest.mark.skipif(shutil.which("bpftool") is None, reason="bpftool is not installed")
_RAW_TYPE = re.compile(r"\[(\d+)\] (\w+) '([^']*)'(.*)")
_ATTR = re.compile(r"(\w+)=(\S+)")


@cache
def bpftool_raw() -> dict[int, tuple[str, str, dict, list]]:
    """bpftool's raw dump of vmlinux: id -> (kind, name, attributes, [(member/param name, attributes)])."""
    out = subprocess.run(["bpftool", "btf", "dump", "file", VMLINUX, "format", "raw"],
                         check=True, capture_output=True, text=True).stdout
    types: dict[int, tuple[str, str, dict, list]] = {}
    cur: list = []
    for line in out.splitlines():
        if line.startswith("["):
            m = _RAW_TYPE.match(line)
            cur = []
            types[int(m[1])] = (m[2], m[3], dict(_ATTR.findall(m[4])), cur)
        elif line.startswith("\t"):
            name = line.split("'")[1] if "'" in line else ""
            cur.append((name, dict(_ATTR.findall(line))))
    return types


@needs_vmlinux
def test_vmlinux_basics():
    btf = BTF.vmlinux()
    assert btf is BTF.vmlinux() and btf.name == "vmlinux" and btf.base is None and len(btf) > 1000
    assert "vmlinux" not in BTF.module_names()
    f = btf.find("ip_send_skb", "func")
    assert c_decl(f) == "int ip_send_skb(struct net *net, struct sk_buff *skb)"
    skb = btf.find("sk_buff", "struct")
    for name in ("len", "data_len", "head", "data", "mac_header", "network_header", "protocol"):
        skb.member(name)
    assert skb.member("len")[0].type.strip().size == 4 and isinstance(skb.member("head")[0].type, Ptr)
    tps = dict(btf.typedefs_to_func_proto("btf_trace_"))
    params = [c_decl(p.type) for p in tps["btf_trace_net_dev_queue"].params]
    assert params == ["void *", "struct sk_buff *"]
    assert "btf_trace_netif_receive_skb" in tps
    assert any(isinstance(t, Const) for t in btf.types("const"))


@needs_vmlinux
@needs_bpftool
def test_vmlinux_member_offsets_match_bpftool():
    raw = bpftool_raw()

    def offset(struct_id: int, name: str) -> int | None:     # bpftool's view, into anonymous members
        for mname, attrs in raw[struct_id][3]:
            tid, bits = int(attrs["type_id"]), int(attrs["bits_offset"])
            if mname == name:
                return bits
            while raw[tid][0] in ("TYPEDEF", "CONST", "VOLATILE"):
                tid = int(raw[tid][2]["type_id"])
            if mname == "(anon)" and raw[tid][0] in ("STRUCT", "UNION"):
                inner = offset(tid, name)
                if inner is not None:
                    return bits + inner
        return None

    skb_id = next(i for i, (k, n, _, _) in raw.items() if k == "STRUCT" and n == "sk_buff")
    skb = BTF.vmlinux().type(skb_id)
    assert skb.name == "sk_buff" and skb.size == int(raw[skb_id][2]["size"])
    for name in ("len", "data_len", "head", "data", "mac_header", "network_header", "protocol", "cloned"):
        assert skb.member(name)[1] == offset(skb_id, name), name
    assert skb.member("len")[0].bit_offset == int(dict(raw[skb_id][3])["len"]["bits_offset"])
    cloned = skb.member("cloned")[0]
    assert cloned.bitfield_size == int(dict(raw[skb_id][3])["cloned"].get("bitfield_size", 0))


@needs_vmlinux
@needs_bpftool
def test_vmlinux_funcs_taking_skb_match_bpftool():
    raw = bpftool_raw()
    targets = {i for i, (k, n, a, _) in raw.items() if n == "sk_buff" and (k == "STRUCT" or k == "FWD"
                                                                          and a.get("fwd_kind") != "union")}

    def close(ids: set[int], kinds: tuple[str, ...]) -> set[int]:
        while True:
            more = {i for i, (k, _, a, _) in raw.items() if k in kinds and int(a.get("type_id", -1)) in ids}
            if more <= ids:
                return ids
            ids = ids | more

    mods = ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG")
    to_struct = close(targets, mods)
    ptrs = {i for i, (k, _, a, _) in raw.items() if k == "PTR" and int(a["type_id"]) in to_struct}
    wanted = close(ptrs, mods)
    protos = {i: [j for j, (_, a) in enumerate(params) if int(a["type_id"]) in wanted]
              for i, (k, _, _, params) in raw.items() if k == "FUNC_PROTO"}
    expected = {n: protos[int(a["type_id"])] for k, n, a, _ in raw.values()
                if k == "FUNC" and protos.get(int(a["type_id"]))}
    got = {f.name: idx for f, idx in BTF.vmlinux().funcs_taking_pointer_to("sk_buff")}
    assert len(expected) > 100 and got == expected
    assert got["ip_send_skb"] == [1]


@needs_vmlinux
@needs_bpftool
def test_vmlinux_typedef_declarations_match_bpftool_format_c():
    out = subprocess.run(["bpftool", "btf", "dump", "file", VMLINUX, "format", "c"],
                         check=True, capture_output=True, text=True).stdout
    btf, checked = BTF.vmlinux(), 0
    for line in out.splitlines():
        if not line.startswith("typedef ") or not line.endswith(";") or "___" in line:
            continue                        # multi-line definitions; names bpftool renamed to avoid clashes
        m = (re.search(r"\(\*\s*(?:const )?(\w+)\)", line) or re.search(r"(\w+)\(", line)
             or re.search(r"(\w+)\[", line) or re.search(r"(\w+);$", line))
        t = btf.find(m[1], "typedef")
        assert f"typedef {c_decl(t.target, t.name)};" == line
        checked += 1
    assert checked > 100


@needs_vmlinux
def test_modules():
    for name in BTF.module_names()[:5]:
        mod = BTF.module(name)
        assert mod is BTF.module(name) and mod.base is BTF.vmlinux() and mod.ids().start == len(BTF.vmlinux())
        for f, idx in mod.funcs_taking_pointer_to("sk_buff"):
            for i in idx:
                ptr = f.proto.params[i].type.strip()
                assert isinstance(ptr, Ptr) and ptr.target.strip().name == "sk_buff"


def test_btf_modules_form_a_line():
    """bpf.btf_types at the bottom (the types and the Table they read), bpf.cdecl above it, bpf.btf above both: no
    module imports one above it, not even for type checking."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "bpf"
    above = {"btf_types": ("btf", "cdecl"), "cdecl": ("btf",)}
    for name, forbidden in above.items():
        tree = ast.parse((root / f"{name}.py").read_text())
        found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not found & set(forbidden), (name, found)
