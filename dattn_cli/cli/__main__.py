"""`python -m dattn_cli.cli`: the same as the `dattn` console script."""

from . import main

main()
