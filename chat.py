#!/usr/bin/env python3
"""Chat with the model in a persistent session: the seed's ``chat.py``, run from the checkout.

Its flags are in ``terrarium.cli.seed``; ``terrarium --help`` has the full command line.
"""

from __future__ import annotations

import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parent / "src"
if (_SRC / "terrarium").is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))  # a plain checkout: use its package

try:
    from terrarium.cli.seed import main
except ImportError as exc:  # the package's dependencies are not installed
    sys.exit(f"chat.py: {exc}; install terrarium first: pip install -e . (or use .venv/bin/python)")

if __name__ == "__main__":
    main()
