"""Helpers for tests that run child processes (``fs_child.py`` holds what the children run)."""
