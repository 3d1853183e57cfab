"""What this host says of a packet beyond the record, read in user space: names of kernel addresses
(/proc/kallsyms), of cgroups, containers and network namespaces (ctxnames over containers), and which nftables rule
dropped a packet (nftrace over nftables' netlink, nftfilter its socket filter). A floor below fcap.kernel: these
import nothing of fcap but its errors."""
