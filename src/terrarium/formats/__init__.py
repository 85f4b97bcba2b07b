"""Formats that are not ours: conversions between the log model and other file formats."""
