"""Every file the project writes goes through here: a crash leaves the old file or the new
one, never half of one (token caches, tokenizers, results, checkpoints), and a disk that
cannot take the write is one line naming the path and the cause.

    atomic_write(path, lambda tmp: ...)     # temp file, fsync, rename
    append_line(path, text)                 # metrics rows: whole lines or nothing
    remove_stale_temporaries(folder)        # what an interrupted atomic_write left behind
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

TEMP_PREFIX, TEMP_SUFFIX = ".", ".tmp"  # temporaries are .<name>.<random>.tmp beside their target


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class StorageError(RuntimeError):
    """A file that could not be written (read-only place, no space left, ...): reported as one line."""


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def storage_error(path: str | Path, error: OSError) -> StorageError:
    causes = {errno.ENOSPC: "no space left on the device", errno.EROFS: "the file system is read-only",
              errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EDQUOT: "disk quota exceeded",
              errno.EFBIG: "file too large"}
    code = error.errno
    if code is None and _free_bytes(Path(path).parent) == 0:  # numpy's short writes carry no errno
        code = errno.ENOSPC
    cause = causes.get(code, error.strerror or str(error) or type(error).__name__)
    return StorageError(f"cannot write {path}: {cause}; nothing half-written was left behind. "
                        "Free space or choose a writable RESULTS_DIR / CACHE_DIR")


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(tmp_path)``, flush it to disk, then rename it onto ``path``.

    The file gets the permissions the umask gives new files (mkstemp alone would make it
    0600, unreadable to colleagues on a shared machine).
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}.", suffix=TEMP_SUFFIX)
        os.close(fd)
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, path)
    except OSError as e:
        if isinstance(e, StorageError):
            raise
        raise storage_error(path, e) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def append_line(path: str | Path, line: str) -> None:
    """Append one line, or nothing: a failed write (full disk) is cut back off the file."""
    path = Path(path)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as e:
        raise storage_error(path, e) from None
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write")
            os.fsync(fd)
        except OSError as e:
            os.ftruncate(fd, size)  # the file ends where it ended before: whole lines only
            raise storage_error(path, e) from None
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete what interrupted ``atomic_write`` calls left in ``folder`` (only call it while no other
    process can be writing there, e.g. under the run's lock); returns what was removed."""
    removed = []
    for tmp in Path(folder).glob(f"{TEMP_PREFIX}*{TEMP_SUFFIX}"):
        if tmp.is_file():
            tmp.unlink()
            removed.append(tmp)
    return removed
