"""Translating a file of any length: read a window of lines at a time,
translate it (the engine sorts it by length into full batches), write its
lines in input order, and keep each finished window on disk so that a
killed job, run again with the same command, resumes after the last
finished window.

Memory stays constant in the input's length: one window of lines and its
translations at a time. The output file appears only when every window is
done, in one rename: under the output's name there is never a partial
file. While the job runs, the finished windows live beside it in
`<output>.parts/` (one file per window, each written atomically, and a
`job.json` that records the command and the input file they belong to);
the directory goes once the output is in place.

A window's translations do not depend on the windows before it (each
engine searches every sentence as it would alone, and seeded samples
depend on the seed and the sentence), so a resumed job writes the same
bytes as an uninterrupted one, and windows can be translated side by side:
`DEFAULT_IN_FLIGHT` at once, each in a thread of its own (`in_order`), the
next starting as the oldest is written. A TensorFlow search of a small
model keeps one core busy at a time, so two windows at once use a second.
"""

import collections
import contextlib
import gzip
import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

from keras_transformer.files import atomic_path, fsync_directory, write_atomically

DEFAULT_WINDOW = 4096
DEFAULT_IN_FLIGHT = 2  # windows translated at once
PARTS_SUFFIX = ".parts"
JOB_FILE = "job.json"
_READ_BYTES = 1 << 20


def _open_binary(path):
    if path in (None, "-"):
        return sys.stdin.buffer
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def iter_lines(path):
    """The lines of `path` (`-`: stdin; `.gz`: gunzipped) one at a time, as
    bytes, without their line ending (`\\n` or `\\r\\n`) or a UTF-8
    byte-order mark at the start. Bytes, so undecodable input reaches the
    translator's U+FFFD rule instead of failing here.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "in.txt")
    >>> _ = open(path, "wb").write(b"\\xef\\xbb\\xbfone\\r\\ntwo\\n\\nthree")
    >>> list(iter_lines(path))
    [b'one', b'two', b'', b'three']
    """
    f = _open_binary(path)
    try:
        yield from split_lines(f)
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def split_lines(f):
    """The lines of the open binary file `f` by `iter_lines`' rules (read
    with `readline`, so any file-like object will do: a gzip stream, a
    cloud file)."""
    first = True
    while line := f.readline():
        if first:
            line = line.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is not text
            first = False
        if line.endswith(b"\n"):
            line = line[:-1]
        yield line[:-1] if line.endswith(b"\r") else line


def one_line(text):
    """A translation on one output line: line breaks become spaces, so
    output line i always translates input line i."""
    return text.replace("\r", " ").replace("\n", " ")


def count_lines(path):
    """How many lines `iter_lines(path)` gives, read in 1 MiB blocks; None
    for stdin."""
    if path in (None, "-"):
        return None
    count, last = 0, b"\n"
    with _open_binary(path) as f:
        while block := f.read(_READ_BYTES):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def windows(lines, size):
    """`lines` (an iterable) as lists of at most `size` items."""
    if size < 1:
        raise ValueError(f"window must be at least 1, received {size}.")
    window = []
    for line in lines:
        window.append(line)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def in_order(work, items, in_flight=DEFAULT_IN_FLIGHT):
    """Yields `work(item)` for each of `items`, in the items' order, with
    up to `in_flight` calls running at once in threads: the next item is
    taken (and `items` read further) only when the oldest result has been
    consumed, so at most `in_flight` results exist at a time. An exception
    of `work` is raised where its result would have been yielded; items
    not yet started are then dropped.

    Example:
    >>> import time
    >>> def slow_first(n):
    ...     time.sleep(0.05 if n == 0 else 0)
    ...     return n * n
    >>> list(in_order(slow_first, range(5), in_flight=2))
    [0, 1, 4, 9, 16]
    """
    if in_flight < 1:
        raise ValueError(f"in_flight must be at least 1, received {in_flight}.")
    if in_flight == 1:
        yield from map(work, items)
        return
    with ThreadPoolExecutor(in_flight, thread_name_prefix="window") as pool:
        pending = collections.deque()
        try:
            for item in items:
                pending.append(pool.submit(work, item))
                if len(pending) == in_flight:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def input_identity(path):
    """What identifies the input file of a job: its absolute path, size
    and modification time (None for stdin)."""
    if path in (None, "-"):
        return None
    info = os.stat(path)
    return {"path": os.path.abspath(path), "bytes": info.st_size,
            "mtime_ns": info.st_mtime_ns}


class ResumableOutput:
    """An output file written window by window through `<output>.parts/`,
    so that a job run again resumes after its last finished window (see
    the module docstring).

    Args:
        path: the output file.
        job: a JSON-able description of the job (the command's settings
            and `input_identity`); a parts directory of another job is
            refused, naming what differs.
    """

    def __init__(self, path, job):
        self.path = path
        self.parts = path + PARTS_SUFFIX
        self.job = job
        job_file = os.path.join(self.parts, JOB_FILE)
        if os.path.isdir(self.parts) and os.path.isfile(job_file):
            with open(job_file, encoding="utf-8") as f:
                found = json.load(f)
            if found != job:
                changed = sorted(k for k in set(found) | set(job) if found.get(k) != job.get(k))
                raise ValueError(
                    f"{self.parts} holds the finished windows of another job (it differs in "
                    f"{', '.join(changed)}): run the same command again to resume it, or "
                    "delete the directory to start over.")
        else:
            os.makedirs(self.parts, exist_ok=True)
            write_atomically(job_file, (json.dumps(job, indent=1, sort_keys=True) + "\n")
                             .encode())

    def _part(self, index):
        return os.path.join(self.parts, f"{index:08d}.txt")

    def finished(self):
        """How many windows, from the first, are finished."""
        index = 0
        while os.path.isfile(self._part(index)):
            index += 1
        return index

    def write(self, index, text):
        """Keeps window `index`'s output (str), atomically."""
        write_atomically(self._part(index), text.encode("utf-8"))

    def close(self, count):
        """Joins the `count` windows into the output file, in one rename,
        and removes the parts."""
        with atomic_path(self.path) as tmp:
            with open(tmp, "wb") as out:
                for index in range(count):
                    with open(self._part(index), "rb") as part:
                        shutil.copyfileobj(part, out)
        fsync_directory(os.path.dirname(os.path.abspath(self.path)))
        shutil.rmtree(self.parts, ignore_errors=True)


def progress_bar(total, initial=0, quiet=False, stream=None):
    """A `tqdm` progress bar of lines on `stream` (default stderr): lines
    done, lines/s and time left. Off (a bar that shows nothing) with
    `quiet` or when the stream is not a terminal; 80 columns on a terminal
    that gives no size (a fresh pseudo-terminal)."""
    from tqdm import tqdm

    stream = stream or sys.stderr
    shown = not quiet and hasattr(stream, "isatty") and stream.isatty()
    try:
        columns = os.get_terminal_size(stream.fileno()).columns if shown else 0
    except (AttributeError, OSError, ValueError):
        columns = 0
    size = {"dynamic_ncols": True} if columns else {"ncols": 80, "nrows": 24}
    return tqdm(total=total, initial=initial, unit=" lines", file=stream, disable=not shown,
                smoothing=0.1, **size)


def translate_file(translate_window, source, output="-", window=DEFAULT_WINDOW, job=None,
                   quiet=False, stdout=None, in_flight=DEFAULT_IN_FLIGHT):
    """Translates `source` window by window with `translate_window(lines,
    first) -> list of output lines` (`first`: the index of the window's
    first line), writing them to `output` in input order (`-`: `stdout`,
    default `sys.stdout`). Up to `in_flight` windows are translated at
    once, each in a thread (`in_order`): `translate_window` must be safe to
    call from two threads. A file `output` appears complete, in one
    rename; from a `source` file it is written through `ResumableOutput`,
    so a job run again with the same `job` resumes after its last finished
    window (from stdin, which cannot be read again, a killed job starts
    over).

    Returns: the number of input lines.
    """
    total = count_lines(source)
    with contextlib.ExitStack() as stack:
        resumable, done, out = None, 0, stdout or sys.stdout
        if output != "-" and source not in (None, "-"):
            resumable = ResumableOutput(output, {**(job or {}), "window": window,
                                                 "input": input_identity(source)})
            done = resumable.finished()
        elif output != "-":
            out = stack.enter_context(open(stack.enter_context(atomic_path(output)), "w",
                                           encoding="utf-8"))
        count = 0
        skipped = done * window if total is None else min(done * window, total)
        bar = stack.enter_context(progress_bar(total, initial=skipped, quiet=quiet))

        def todo():
            """`(index, first, lines)` of each window not finished before."""
            nonlocal count
            for index, lines in enumerate(windows(iter_lines(source), window)):
                first = count
                count += len(lines)
                if index >= done:
                    yield index, first, lines

        def translated(item):
            index, first, lines = item
            return index, len(lines), "".join(
                line + "\n" for line in translate_window(lines, first))

        for index, size, text in in_order(translated, todo(), in_flight):
            if resumable is None:
                out.write(text)
                out.flush()
            else:
                resumable.write(index, text)
            bar.update(size)
    if resumable is not None:
        resumable.close(-(-count // window))
    return count
