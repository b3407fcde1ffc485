"""Every file the project writes goes through here: a crash leaves the old file or the new
one, never half of one (token caches, tokenizers, results, checkpoints), and a disk that
cannot take the write is one line naming the path and the cause.

    atomic_write(path, lambda tmp: ...)     # temp file, fsync, rename
    append_line(path, text)                 # metrics rows: whole lines or nothing
    remove_stale_temporaries(folder)        # what an interrupted atomic_write left behind

A temporary is locked (flock) by the process writing it, for as long as it writes: the lock goes
with the process, so a temporary nobody holds is what a killed write left, and is safe to remove
even in a cache that other runs are writing at the same time.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from reservoir.platform.messages import OneLineError

TEMP_PREFIX, TEMP_SUFFIX = ".", ".tmp"  # temporaries are .<name>.<random>.tmp beside their target


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class StorageError(OneLineError, RuntimeError):
    """A file that could not be written (read-only place, no space left, ...): reported as one line."""


NEARLY_FULL_BYTES = 1 << 20  # a write with no errno that failed with less than this free: the disk was full


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


CAUSES = {errno.ENOSPC: "no space left on the device", errno.EROFS: "the file system is read-only",
          errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EDQUOT: "disk quota exceeded",
          errno.EFBIG: "file too large"}  # an OSError's errno in words


WRITABLE = "choose a writable RESULTS_DIR / CACHE_DIR"  # where a run writes (a command writing elsewhere: its own)


def storage_error(path: str | Path, error: OSError, place: str = WRITABLE) -> StorageError:
    code = error.errno
    free = _free_bytes(Path(path).parent)
    if code is None and free is not None and free < NEARLY_FULL_BYTES:  # numpy's and torch's failed writes
        code = errno.ENOSPC  # carry no errno
    cause = CAUSES.get(code, error.strerror or str(error) or type(error).__name__)
    return StorageError(f"cannot write {path}: {cause}; nothing half-written was left behind. Free space or {place}")


def atomic_write(path: str | Path, write, place: str = WRITABLE) -> None:
    """Call ``write(tmp_path)``, flush it to disk, then rename it onto ``path`` (a failure says where else to write:
    ``place``).

    The file gets the permissions the umask gives new files (mkstemp alone would make it
    0600, unreadable to colleagues on a shared machine).
    """
    path = Path(path)
    tmp, lock_fd = None, None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}.", suffix=TEMP_SUFFIX)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # "being written": remove_stale_temporaries leaves it alone
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except OSError as e:
        if isinstance(e, StorageError):
            raise
        raise storage_error(path, e, place) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        if lock_fd is not None:
            os.close(lock_fd)


REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout: what committed records name paths against


def portable_path(text: str) -> str:
    """An absolute path as a record committed for readers on other machines names it: relative to the
    repository ('../shared/data/tinystories'), so it names no machine's layout above the checkout."""
    if not isinstance(text, str) or not os.path.isabs(text):
        return text
    return os.path.relpath(text, REPOSITORY)


_ABSOLUTE = re.compile(r"(?<![\w.~])/[^\s,;'\"\]]+")  # an absolute path inside a text (a list, a description)


def portable_paths_in(text: str) -> str:
    """``text`` with every absolute path in it made ``portable_path``: a setting's list of files, a description."""
    return _ABSOLUTE.sub(lambda m: portable_path(m.group(0)), text) if isinstance(text, str) else text


def repository_path(path: str | Path) -> str:
    """``path`` as a report names it: relative to the checkout where it lies inside it, whatever the working folder
    and however it was given (a committed report is the same wherever it was made); elsewhere as given."""
    inside = portable_path(os.path.abspath(path))
    return Path(inside).as_posix() if inside != ".." and not inside.startswith("../") else str(path)


def make_folder(path: str | Path) -> Path:
    """``path`` and its parents, created if missing; a place that cannot take them is one line."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        cause = CAUSES.get(e.errno, e.strerror or type(e).__name__)
        raise StorageError(f"cannot create {path}: {cause}; choose a writable RESULTS_DIR") from None
    return path


class Busy(Exception):
    """``lock_folder`` found the folder held: ``holder`` is what its holder wrote ("pid 123 on host")."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def lock_folder(folder: str | Path) -> int:
    """Hold ``folder``/.lock (flock) for as long as the returned descriptor is open; the OS drops it when the
    process dies, so a killed holder never leaves a stale lock. Raises ``Busy`` if another process holds it."""
    lock_file = Path(folder) / ".lock"
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise storage_error(lock_file, e) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise Busy(holder) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    return fd


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
    """Delete what interrupted ``atomic_write`` calls left in ``folder``: temporaries no live process
    holds locked (one being written by another run stays); returns what was removed."""
    removed = []
    for tmp in Path(folder).glob(f"{TEMP_PREFIX}*{TEMP_SUFFIX}"):
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:  # gone meanwhile (its writer finished), or not ours to read
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a write in progress
        else:
            try:
                tmp.unlink()
                removed.append(tmp)
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed
