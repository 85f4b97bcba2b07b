"""``python -m terrarium.cli``."""

from terrarium.cli import main

main()
