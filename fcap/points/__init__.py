"""Where a capture attaches: the -i grammar, point kinds, semantic points, BTF member paths."""
