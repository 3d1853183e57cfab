"""fcap: tcpdump for any point inside the Linux network stack."""

__version__ = "0.1.0"
