"""File modes that honour the process's umask for what the package writes
through temporary names (`tempfile.mkstemp` makes files 0600 and
`tempfile.mkdtemp` directories 0700, whatever the umask), so that a
SavedModel or a run directory is readable by whom the umask allows: TF
Serving under another uid, a teammate."""

import os
import re


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
