"""`python -m fcap`: the fcap command."""

from fcap.commands.cli import run

run()
