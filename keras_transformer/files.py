"""Writing files so that nothing is lost or hidden: `atomic_path` and
`write_atomically` (a temporary name, fsync, a rename) and
`replace_directory` (the same for a whole directory), and modes that honour the process's
umask for what is written through temporary names (`tempfile.mkstemp`
makes files 0600 and `tempfile.mkdtemp` directories 0700, whatever the
umask), so that a SavedModel or a run directory is readable by whom the
umask allows: TF Serving under another uid, a teammate."""

import contextlib
import ctypes
import errno
import os
import re
import shutil
import tempfile

# renameat2(2)'s flag that swaps two existing names in one step (Linux).
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def current_umask():
    """The process's umask, read without changing it where Linux shows it
    (`/proc/self/status`); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            match = re.search(r"^Umask:\s*([0-7]+)$", f.read(), re.M)
        if match:
            return int(match.group(1), 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path):
    """Gives `path` the mode a plain `open` or `os.mkdir` would have given
    it: 0666 (files) or 0777 (directories) less the umask."""
    full = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, full & ~current_umask())


@contextlib.contextmanager
def atomic_path(path):
    """A temporary path beside `path` for the caller to write. Leaving the
    block without an error flushes it to disk, gives it the mode the umask
    gives a new file and renames it to `path`, so a reader never sees a
    partial file, even after `kill -9`; an error removes it and `path` keeps
    what it held.

    Example:

    ```python
    import os
    import tempfile

    from keras_transformer.files import atomic_path

    path = os.path.join(tempfile.mkdtemp(), "out.txt")
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write("whole")
    assert open(path).read() == "whole"
    ```
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-" + os.path.basename(path))
    os.close(fd)
    try:
        yield tmp
        honour_umask(tmp)  # mkstemp's 0600 would hide it from other users
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(directory)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_atomically(path, data):
    """Writes `data` (bytes) to `path` through `atomic_path`. The file gets
    the mode the umask gives a new file (0644 under umask 022)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def fsync_directory(path):
    """Flushes a directory's entries (a rename into it) to disk, so a crash
    after the rename cannot lose it; a no-op where directories cannot be
    opened (not POSIX)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory
    finally:
        os.close(fd)


def replace_directory(new, path):
    """Puts the complete directory `new` at `path` and deletes the directory
    that was there, so that a reader never finds a partial directory at
    `path`, even after `kill -9`: `new`'s files and entries are flushed to
    disk first, then `new` is renamed to `path`. Where Linux swaps two names
    in one step (`renameat2` with `RENAME_EXCHANGE`) a crash leaves the old
    directory or the new one at `path`, never neither; elsewhere the old one
    is renamed aside to `<new>.old` first, and a crash between the two
    renames leaves both under those temporary names and nothing at `path`."""
    _fsync_tree(new)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(path):
        os.rename(new, path)
        fsync_directory(parent)
        return
    old = new
    if not _exchange(new, path):
        old = new + ".old"
        os.rename(path, old)
        try:
            os.rename(new, path)
        except BaseException:
            os.rename(old, path)
            raise
    # Made durable before the old files go, so a crash cannot bring back
    # the old name over a half-deleted directory.
    fsync_directory(parent)
    shutil.rmtree(old)


def _exchange(a, b):
    """Swaps the names `a` and `b` in one step; False where the system or
    the file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), a, None, b)


def _fsync_tree(root):
    """Flushes every file and directory entry under `root` to disk."""
    for directory, _, names in os.walk(root, topdown=False):
        for name in names:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(directory)
