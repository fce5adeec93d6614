"""Result files that are whole or absent: written to a temporary sibling, then renamed.

A reader (or a later command) sees the old file or the new one, never a truncated mix, even
when the writer is SIGKILLed or the disk fills mid-write. The temporary sibling's name says
who wrote it (`.NAME.tmp-HOST-PID-RANDOM`), so the next writer into that directory removes
the ones whose process is gone (`remove_stale`), with a notice; a live writer's is left alone.
A failed write becomes one line naming the file (`user_errors`; a full disk says so);
`result_file` / `write_result` do both for the files a user reads.

A directory is replaced by a swap (`swap_directory`): on Linux one renameat2(RENAME_EXCHANGE)
call exchanges the new and the old directory, so the path names a complete old or a complete
new directory at every instant.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from longctx.base.errors import UserError
from longctx.storage.locks import Holder, is_alive

_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<host>[^/]+)-(?P<pid>\d+)-[a-z0-9_]+")
_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust libraries (safetensors) report an errno
_FULL = (errno.ENOSPC, errno.EDQUOT)
_RENAME_EXCHANGE = 2


def _prefix(path: Path, kind: str = "tmp") -> str:
    return f".{path.name}.{kind}-{socket.gethostname()}-{os.getpid()}-"


def temp_sibling_name(path: Path, kind: str = "tmp") -> str:
    """The prefix a temporary sibling of `path` starts with (for tests and cleanup)."""
    return _prefix(Path(path), kind)


def owner_of(temp: Path) -> Optional[Holder]:
    """Who wrote a temporary sibling (None for a name this module did not make)."""
    match = _TEMP.fullmatch(temp.name)
    if not match:
        return None
    return Holder(match["host"], int(match["pid"]), None, 0.0)


def remove_stale(directory: Path, notify: Optional[Callable[[str], None]] = None, *,
                 name: Optional[str] = None) -> list[Path]:
    """Remove the temporary siblings in `directory` (of `name` only, when given) whose writer
    is no longer running on this host; returns what was removed.

    The one exception: a directory set aside by an unfinished swap (`.NAME.old-...`, see
    swap_directory) whose NAME is missing is the complete old directory; it is renamed back
    instead (and not in the list)."""
    removed = []
    if not directory.is_dir():
        return removed
    for entry in sorted(directory.iterdir()):
        match = _TEMP.fullmatch(entry.name)
        if match is None or (name is not None and match["name"] != name):
            continue
        holder = owner_of(entry)
        if holder.pid == os.getpid() and holder.host == socket.gethostname():
            continue  # our own work in progress
        if is_alive(holder) is not False:
            continue  # alive, or on another host (cannot tell)
        original = directory / match["name"]
        if match["kind"] == "old" and not os.path.lexists(original):
            os.rename(entry, original)
            if notify is not None:
                notify(f"restored {original} from {entry.name}, set aside by pid {holder.pid} on {holder.host}, "
                       "which stopped before its swap finished")
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        if notify is not None:
            notify(f"removed {entry}, left by pid {holder.pid} on {holder.host}, which is no longer running")
        removed.append(entry)
    return removed


def os_error(e: BaseException) -> Optional[OSError]:
    """`e` as an OSError: itself, or one rebuilt from a library error that names an errno
    (safetensors: "... (os error 28)"); None for anything else."""
    if isinstance(e, OSError):
        return e
    match = _OS_ERROR.search(str(e))
    if match is None:
        return None
    code = int(match[1])
    return OSError(code, os.strerror(code))


def write_error(e: OSError, path: str | os.PathLike) -> UserError:
    """The one line for a write of `path` that failed with `e`: it names the file and, for a
    full disk or quota, says so with the space left."""
    where = Path(e.filename) if isinstance(e.filename, str) and e.filename else Path(path)
    if owner_of(where) is not None:
        where = Path(path)  # our temporary sibling: name the file the user asked for
    if e.errno in _FULL:
        return UserError(f"cannot write {where}: the disk (or quota) is full ({_free(where)} free); free some "
                         "space or choose another directory")
    return UserError(f"cannot write {where} ({e.strerror or e})")


@contextmanager
def user_errors(path: str | os.PathLike) -> Iterator[None]:
    """Failed writes in the block (writing `path`) become one UserError line (write_error)."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        err = os_error(e)
        if err is None:
            raise
        raise write_error(err, path) from None


def free_bytes(path: Path) -> Optional[int]:
    """The space a non-root writer has left on the file system holding `path` (or its
    nearest existing parent); None when it cannot be read. Quotas do not show here."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def human_size(n: int) -> str:
    """A size for a sentence: GiB, MiB or KiB with one decimal, else bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _free(path: Path) -> str:
    free = free_bytes(path)
    return "unknown" if free is None else human_size(free)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling to write `path`'s new content into (by any writer: savefig,
    csv, safetensors); on a clean exit it is fsynced and renamed over `path`, on an error it
    is removed and `path` is untouched."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=_prefix(path), dir=parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are for teammates too
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(parent)


def note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr, flush=True)


@contextmanager
def result_file(path: str | os.PathLike, notify: Optional[Callable[[str], None]] = note) -> Iterator[Path]:
    """replacing() for a result file a user reads (results.json, a figure, a table): the
    temporaries of `path` that a dead writer left are removed first (with a notice), and a
    failed write is one UserError line naming `path`."""
    path = Path(path)
    with user_errors(path):
        remove_stale(path.parent if str(path.parent) else Path("."), notify, name=path.name)
        with replacing(path) as tmp:
            yield tmp


def write_result(path: str | os.PathLike, data: str | bytes, notify: Optional[Callable[[str], None]] = note) -> Path:
    """A result file's whole content (text is UTF-8), written as result_file() says."""
    with result_file(path, notify) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj, *, indent: Optional[int] = 2) -> Path:
    return write_text(path, json.dumps(obj, indent=indent) + "\n")


def write_lines(path: str | os.PathLike, lines) -> Path:
    """JSON lines (json.dumps defaults, as RULER writes them)."""
    return write_text(path, "".join(json.dumps(line) + "\n" for line in lines))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_temp_dir(path: str | os.PathLike) -> Path:
    """An empty temporary sibling directory of `path` (mode per the umask) to build it in."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(path), dir=parent))
    tmp.chmod(0o777 & ~_umask())
    return tmp


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2); False where the call is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False  # this kernel or file system cannot exchange
    raise OSError(err, os.strerror(err), str(b))


def swap_directory(new: Path, path: Path) -> None:
    """Make the finished directory `new` (a temporary sibling) be `path`. A new `path` is a
    rename; an existing one is exchanged in one step and the old content removed. Where the
    file system cannot exchange, the old directory is renamed aside first (a crash between the
    two renames leaves both complete directories as siblings, never a mix, and the next
    remove_stale there renames the old one back)."""
    path = Path(path)
    if not path.exists():
        os.rename(new, path)
        _fsync_dir(path.parent)
        return
    if _exchange(new, path):
        shutil.rmtree(new, ignore_errors=True)  # `new` now holds the old content
    else:
        old = path.with_name(_prefix(path, "old") + os.urandom(4).hex())
        os.rename(path, old)
        os.rename(new, path)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(path.parent)
