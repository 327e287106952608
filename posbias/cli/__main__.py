"""`python -m posbias.cli`: the `posbias` command."""

from posbias.cli.app import main

main()
