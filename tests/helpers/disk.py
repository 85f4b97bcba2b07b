"""A small tmpfs that a test can fill to the last byte: a full disk the kernel makes."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str = "4m") -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``folder`` (made here) for the block; skip the test
    where mounting is not allowed."""
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; the filler file, to unlink."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as out:
        for size in (1 << 16, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)
    assert os.statvfs(folder).f_bavail == 0
    return filler
