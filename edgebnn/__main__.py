"""``python -m edgebnn`` runs the command line."""

from edgebnn.cli import main

main()
