import errno, os
from fcap.host import nftables as nft, nftrace
from bpf.maps import HashMap, PerCPUArrayMap
from bpf.uapi import MapFlags
from fcap.kernel import nftfilter
from fcap.kernel.layout import NFT_SLOT, NFT_TEXT
slots = PerCPUArrayMap(NFT_SLOT.size, 1, name="t_nftslot")
texts = HashMap(8, NFT_TEXT.size, 64, name="t_nfttext", flags=MapFlags.NO_PREALLOC)
import sys
mode = sys.argv[1]
c = nft.NfSocket()
def parts(owner, table="dbgt"):
    p = [nft.new_table(table, owner)]
    for chain, hook in nftrace.HOOKS:
        p += [nft.new_base_chain(table, chain, hook, nft.PRIORITY_FIRST), nft.new_trace_rule(table, chain)]
    return p
if mode == "plain":
    for owner in (True, False, True):
        err = c.transact(nft.Family.inet, *parts(owner))
        print("owner", owner, errno.errorcode.get(err, err))
        c.transact(nft.Family.inet, nft.del_table("dbgt"))
else:
    l = nft.NfSocket(trace=True, rcvbuf=1<<20)
    nftfilter.attach(l.sock, slots.fileno(), texts.fileno(), 0)
    for owner in (True, False, True):
        err = c.transact(nft.Family.inet, *parts(owner))
        print("attached owner", owner, errno.errorcode.get(err, err))
        c.transact(nft.Family.inet, nft.del_table("dbgt"))
