"""``python -m superinfer`` runs the CLI."""

from superinfer.cli import main

main()
