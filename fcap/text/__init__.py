"""Packets as tcpdump prints them."""
