"""pcap and pcapng, read and written; rotation; link types."""
