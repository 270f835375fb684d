"""`python -m dattn_cli`: the same as the `dattn` console script."""

from .cli import main

main()
