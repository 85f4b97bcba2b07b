"""``python -m terrarium``: the ``terrarium`` command line."""

from terrarium.cli import main

main()
