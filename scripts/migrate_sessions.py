#!/usr/bin/env python3
"""Migrate a legacy Terrarium sessions folder into date folders (and, with --to-log, the log).

    python scripts/migrate_sessions.py --dry-run             # preview, change nothing
    python scripts/migrate_sessions.py                       # migrate ./sessions
    python scripts/migrate_sessions.py --storage-dir ./my_sessions --to-log

A thin wrapper over :func:`terrarium.migrate.migrate`; see that module for what it does and
why an interrupted run can simply be run again. Exits 1 if any file failed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import terrarium  # noqa: F401
except ImportError:  # a plain checkout: use the package from src/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from terrarium.migrate import migrate


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the migration, return the exit code."""
    parser = argparse.ArgumentParser(
        description="Move flat legacy session files into date folders "
        "(and optionally import them into the native log)."
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be done; change nothing"
    )
    parser.add_argument(
        "--storage-dir",
        default="./sessions",
        help="the sessions folder (default: ./sessions)",
    )
    parser.add_argument(
        "--to-log",
        action="store_true",
        help="also import each session into the native log (skips contexts already there)",
    )
    args = parser.parse_args(argv)
    try:
        report = migrate(args.storage_dir, dry_run=args.dry_run, to_log=args.to_log)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
