"""What the user types: the fcap command and its subcommands, at the terminal's edge."""
