"""Whether a file is unchanged, in one place: the watcher, the snapshot, a build's "weights
files unchanged, share the serving tensors", and the checkpoint check all ask it.

A file's stamp is its device, inode, size and modification time: a write in place moves the
modification time (and usually the size), a save by rename brings a new inode. Not the
change time: a hard link moves it without changing a byte, and the snapshot links every
large weights file on every reload. A stamp costs one stat; content hashes are the
watcher's, for small files only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class FileStamp:
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of_stat(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> FileStamp | None:
        """The file's stamp, or None when it cannot be read (missing, no permission)."""
        try:
            return cls.of_stat(os.stat(path))
        except OSError:
            return None

    def same_file(self, other: FileStamp | None) -> bool:
        """The same file (device and inode), whatever was written to it since."""
        return other is not None and (self.dev, self.ino) == (other.dev, other.ino)

    def __str__(self) -> str:
        return f"{self.dev}:{self.ino}:{self.size}:{self.mtime_ns}"
