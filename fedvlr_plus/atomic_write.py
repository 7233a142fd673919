"""Files that are either written completely or not at all, and a file-system failure as one clear line.

A write goes to a hidden temporary file beside the target (same folder, so the rename cannot cross file systems),
is flushed to disk, and is renamed over the target. Whatever fails on the way, the temporary file is removed, so
a full or read-only disk leaves the folder as it was. An ``OSError`` (no space, read-only, no permission) becomes
a :class:`~fedvlr_plus.errors.UserError` that names the path: the user can act on it, a traceback would not help.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from .errors import UserError

_HINTS = {
    errno.ENOSPC: "free some disk space or write to another folder",
    errno.EDQUOT: "free some space in your quota or write to another folder",
    errno.EROFS: "the file system is read-only; write to another folder",
    errno.EACCES: "no permission; write to another folder",
    errno.EPERM: "no permission; write to another folder",
}


def output_error(path, exc: OSError) -> UserError:
    """``exc`` raised while writing ``path``, as one line naming the path and what to do."""
    why = f"cannot write ({exc.strerror or exc})"
    return UserError(str(path), why, _HINTS.get(exc.errno))


def os_error_of(exc: BaseException) -> OSError | None:
    """The file-system error behind ``exc``: ``exc`` itself when it is an ``OSError``; else one that writers in
    other languages (safetensors in Rust, faiss in C++) report in their message as ``os error 28`` or by its
    text (``No space left on device``). None when ``exc`` is not a file-system error."""
    import re

    if isinstance(exc, OSError):
        return exc
    text = str(exc)
    found = re.search(r"os error (\d+)", text)
    if found:
        code = int(found.group(1))
        return OSError(code, os.strerror(code))
    for code in _HINTS:
        if os.strerror(code) in text:
            return OSError(code, os.strerror(code))
    return None


def temp_path(path: Path) -> Path:
    """The temporary file that a write of ``path`` goes through (hidden, unique to this process)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def is_temp_file(path: Path) -> bool:
    """Whether ``path`` is a temporary file left by a write that was killed (``.NAME.tmpPID``)."""
    name = Path(path).name
    stem, sep, pid = name.rpartition(".tmp")
    return name.startswith(".") and bool(sep) and pid.isdigit()


def make_dirs(folder) -> Path:
    """``mkdir -p folder``, with a failure as one line naming the folder."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(folder, exc) from exc
    return folder


def atomic_write(path, write: Callable[[Path], None]) -> None:
    """Write ``path`` by calling ``write(temporary_path)``, then flush it to disk and rename it into place."""
    path = Path(path)
    make_dirs(path.parent)
    tmp = temp_path(path)
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except Exception as exc:
        cause = os_error_of(exc)
        if cause is None:
            raise
        raise output_error(path, cause) from exc
    finally:
        # after a successful rename there is nothing left to remove; after any failure the partial file goes
        tmp.unlink(missing_ok=True)


def failed_folder_write(tmp: Path, path, exc: BaseException) -> None:
    """After a failed write of the folder ``path`` through the temporary folder ``tmp``: ``tmp`` removed, and a
    full or read-only disk raised as one line naming ``path`` (any other failure is the caller's to re-raise)."""
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    cause = os_error_of(exc) if isinstance(exc, Exception) else None
    if cause is not None:
        raise output_error(path, cause) from exc


def atomic_write_bytes(path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
