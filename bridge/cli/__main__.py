"""`python -m bridge.cli`."""

from bridge.cli import run

run()
