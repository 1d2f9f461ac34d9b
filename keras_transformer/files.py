"""Writing files so that nothing is lost or hidden: `write_atomically`
(a temporary name, fsync, a rename), and modes that honour the process's
umask for what is written through temporary names (`tempfile.mkstemp`
makes files 0600 and `tempfile.mkdtemp` directories 0700, whatever the
umask), so that a SavedModel or a run directory is readable by whom the
umask allows: TF Serving under another uid, a teammate."""

import os
import re
import tempfile


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


def write_atomically(path, data):
    """Writes `data` (bytes) to `path` via a temporary file and a rename, so a
    reader never sees a partial file, even after `kill -9`. The file gets
    the mode the umask gives a new file (0644 under umask 022)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-" + os.path.basename(path))
    try:
        honour_umask(tmp)  # mkstemp's 0600 would hide it from other users
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(directory)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
