"""`python -m posbias.service.cli`: the `posbias` command."""

from posbias.service.cli.app import main

main()
