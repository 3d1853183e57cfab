"""The capture program and its record: the program builder, the record's layout, and the per-packet features."""
