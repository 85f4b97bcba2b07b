"""Formats that are not ours: conversions between the log model and other file formats."""

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
"""The endings of an archive's name: what ``export`` writes as one, and ``import`` reads as a
bundle (here, where both import it without an import circle)."""
