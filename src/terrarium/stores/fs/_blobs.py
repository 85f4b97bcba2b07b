"""``FsStore``'s blobs: large outputs as files ``.blobs/{digest[:2]}/{digest[2:]}``.

A blob file appears whole or not at all and is checked against its name when read. GC finds
the references by scanning every log file under the root (plain or compressed) for digests.
Puts hold a shared ``flock`` on ``.locks/blobs`` and GC an exclusive one while it deletes, so
a blob put again while GC runs is never lost.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from terrarium.blobrefs import check_digest, digest_of, scan_digests
from terrarium.errors import BlobNotFound, CorruptBlob, StoreError
from terrarium.stores._files import listdir, make_dirs, read_chunks, write_new
from terrarium.stores.fs._layout import INDEX, LOCKS
from terrarium.stores.fs._segments import os_reason, read_file
from terrarium.stores.fs._states import FsStates

#: The folder of the blobs, under the root.
BLOBS = ".blobs"
_SKIP = frozenset({INDEX, BLOBS, LOCKS})


class FsBlobs(FsStates):
    """:class:`~terrarium.stores.base.BlobStore` for ``FsStore`` (see the module docstring)."""

    def _blob_path(self, digest: str) -> Path:
        check_digest(digest)
        return self._inside(self.root / BLOBS / digest[:2]) / digest[2:]

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` once (a new file appears whole); return its digest."""
        digest = digest_of(data)
        path = self._blob_path(digest)
        if os.path.islink(self.root / BLOBS):
            raise StoreError(f"{self.root / BLOBS} is a link: terrarium never follows one")
        try:
            with self._lock_file("blobs", shared=True):
                with contextlib.suppress(FileNotFoundError):
                    os.utime(path, follow_symlinks=False)  # there already: spared by GC again
                    return digest
                make_dirs(path.parent)
                with contextlib.suppress(FileExistsError):  # another writer put it meanwhile
                    write_new(path, data, sync=self._sync)
        except OSError as exc:  # a full disk, say: nothing half written is left (write_new)
            raise StoreError(f"cannot store blob {digest}: {os_reason(exc)}") from exc
        return digest

    def get_blob(self, digest: str) -> bytes:
        """The blob's bytes, checked against ``digest``."""
        path = self._blob_path(digest)
        try:
            data = read_file(path)
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} is missing ({path})") from None
        except OSError as exc:
            raise StoreError(f"{path}: cannot read blob: {exc.strerror}") from None
        if digest_of(data) != digest:
            raise CorruptBlob(f"{path}: the blob's bytes do not match its digest {digest}")
        return data

    def has_blob(self, digest: str) -> bool:
        """Whether the blob's file exists."""
        return os.path.lexists(self._blob_path(digest))

    def blob_digests(self) -> list[str]:
        """Every stored blob's digest, sorted."""
        found = []
        for prefix in listdir(self._inside(self.root / BLOBS)):
            for rest in listdir(self._inside(self.root / BLOBS / prefix)):
                digest = prefix + rest
                if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
                    found.append(digest)
        return sorted(found)

    def blob_references(self) -> dict[str, str]:
        """Every digest a log file under the root refers to, with one file that does."""
        found: dict[str, str] = {}
        for folder, dirs, files in os.walk(self.root):
            if folder == str(self.root):
                dirs[:] = [d for d in dirs if d not in _SKIP]
            for name in files:
                if ".json" not in name or name.startswith(".tmp-"):
                    continue  # holds no log lines (those are .jsonl, .json, .jsonl.zst, ...)
                path = Path(folder, name)
                try:
                    digests = scan_digests(read_chunks(path))
                except FileNotFoundError:
                    continue  # moved meanwhile (an archive, a trash): found where it went
                except Exception as exc:  # a damaged compressed file, say: keep every blob
                    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
                        continue  # a link, never followed
                    raise StoreError(f"{path}: cannot scan for blob references: {exc}") from exc
                for digest in digests:
                    found.setdefault(digest, str(path))
        return found

    def delete_unreferenced_blobs(self, *, stored_before: float) -> int:
        """Delete blob files no log refers to, last put before ``stored_before`` (and
        temporary files a kill left). No move runs meanwhile (``.locks/lifecycle`` held
        exclusively): a log renamed into a folder the scan had passed would be missed."""
        with self._quiet(exclusive=True):
            referenced = self.blob_references()
            deleted = 0
            with self._lock_file("blobs"):
                for prefix in listdir(self._inside(self.root / BLOBS)):
                    folder = self._inside(self.root / BLOBS / prefix)
                    for name in listdir(folder):
                        path = folder / name
                        try:
                            st = os.lstat(path)
                        except FileNotFoundError:
                            continue
                        if not stat.S_ISREG(st.st_mode) or st.st_mtime >= stored_before:
                            continue
                        if name.startswith(".tmp-"):
                            os.unlink(path)
                        elif prefix + name not in referenced and len(prefix + name) == 64:
                            os.unlink(path)
                            deleted += 1
            return deleted
