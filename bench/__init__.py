"""fcap against tcpdump on the same loopback flood: share captured, sender slowdown, capture CPU, start-up."""
