"""`python -m cli`: the `kb` command from a checkout, without an installed script."""

from cli import main

main()
