"""A pure-Python BPF toolkit: BTF, assembler, syscalls, maps, buffers, links, cBPF translation."""
