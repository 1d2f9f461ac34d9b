"""Parallel text files: one sentence per line, source and target files line
by line aligned, optionally gzipped. TensorFlow-only module.

The files are checked once in Python (each line must decode as UTF-8 and
hold no NUL byte, both files must exist, be non-empty and have the same
number of lines), with errors naming the file and the line; the dataset
itself then streams them with `tf.data.TextLineDataset`, so corpora larger
than memory work.

A directory of such files (the Multi30k layout)::

    train.en.gz  train.de.gz  val.en.gz  val.de.gz  test_2016_flickr.en.gz ...

is read with `text_directory_source(directory, split, src_lang, tgt_lang)`,
where `split` is a file prefix (`train`, `val`, `test_2016_flickr`) or one of
the generic names `train`, `validation`, `test` (see `SPLIT_ALIASES`).
"""

import gzip
import os

import tensorflow as tf

GZIP_MAGIC = b"\x1f\x8b"

# Generic split names -> file prefixes tried in order.
SPLIT_ALIASES = {
    "train": ("train",),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "test_2016_flickr", "test2016"),
}


class TextFileError(ValueError):
    """A parallel text file is missing, empty, undecodable or misaligned."""


def is_gzipped(path):
    """True when `path` starts with the gzip magic bytes (whatever its name)."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def _open_binary(path, gzipped=None):
    """`path` opened for reading bytes, gunzipped when it is gzip
    (`gzipped`: already known, else read from the content)."""
    gzipped = is_gzipped(path) if gzipped is None else gzipped
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def checked_lines(path, expected="UTF-8 text, one sentence per line"):
    """Yields `(line_number, line)` of a (possibly gzipped) file, 1-based,
    each `line` the raw `bytes` (line end included), checked to decode as
    UTF-8 and to hold no NUL byte (the mark of UTF-16 text or binary data,
    never of a sentence).

    Raises `TextFileError` naming the file (and the line) when it is missing,
    not valid gzip, or a line is not valid UTF-8 or holds a NUL byte;
    `expected` completes the line errors' "Expected ..." sentence. An empty
    file yields nothing.
    """
    if not os.path.isfile(path):
        raise TextFileError(f"{path}: no such file.")
    try:
        with _open_binary(path) as f:
            for number, line in enumerate(f, start=1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise TextFileError(
                        f"{path}, line {number}: not valid UTF-8 ({e.reason} at byte "
                        f"{e.start}: {line[max(0, e.start - 10):e.start + 10]!r}). Expected "
                        f"{expected}."
                    ) from None
                if b"\0" in line:
                    at = line.index(b"\0")
                    raise TextFileError(
                        f"{path}, line {number}: a NUL byte at byte {at} "
                        f"({line[max(0, at - 10):at + 10]!r}): a binary or UTF-16 file? "
                        f"Expected {expected}."
                    )
                yield number, line
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError.
        raise TextFileError(f"{path}: cannot be read as a text or gzip file ({e}).") from None


def count_lines(path):
    """Number of lines of a (possibly gzipped) UTF-8 text file.

    Raises `TextFileError` naming the file (and the line, 1-based) when it is
    missing, empty, not valid gzip, or a line is not valid UTF-8 or holds a
    NUL byte.
    """
    count = sum(1 for _ in checked_lines(path))
    if count == 0:
        raise TextFileError(f"{path}: the file is empty; expected one sentence per line.")
    return count


def validate_parallel_files(source_path, target_path):
    """Checks both files and that they are aligned; returns the line count."""
    source_lines = count_lines(source_path)
    target_lines = count_lines(target_path)
    if source_lines != target_lines:
        raise TextFileError(
            f"Parallel files have different line counts: {source_path} has "
            f"{source_lines} lines, {target_path} has {target_lines}; line "
            f"{min(source_lines, target_lines) + 1} has no counterpart. Expected one "
            "sentence per line, aligned line by line."
        )
    return source_lines


# The UTF-8 byte-order mark some editors put first in a file: not text.
UTF8_BOM = b"\xef\xbb\xbf"


def starts_with_bom(path, gzipped=None):
    """True when the (gunzipped) content of `path` starts with `UTF8_BOM`."""
    with _open_binary(path, gzipped) as f:
        return f.read(len(UTF8_BOM)) == UTF8_BOM


def line_dataset(path):
    """`tf.data.TextLineDataset` of `path`, gunzipped when its content is
    gzip, without a UTF-8 byte-order mark at the start of the file."""
    gzipped = is_gzipped(path)
    lines = tf.data.TextLineDataset(path, compression_type="GZIP" if gzipped else "")
    if not starts_with_bom(path, gzipped):
        return lines  # no map over every line (docs/performance.md)
    first = lines.take(1).map(lambda line: tf.strings.substr(line, len(UTF8_BOM), -1))
    return first.concatenate(lines.skip(1))


def parallel_text_dataset(source_path, target_path, validate=True):
    """`(source_text, target_text)` pairs from two aligned text files.

    Args:
        source_path, target_path: plain or gzipped UTF-8 files, one sentence
            per line (gzip is detected from the content, not the name).
        validate: check the files first (see `validate_parallel_files`).

    Returns: a `tf.data.Dataset` of `(tf.string [], tf.string [])`, without
    `\\r` (Windows line ends; a `\\r` inside a line is dropped too).
    """
    if validate:
        validate_parallel_files(source_path, target_path)

    # No map over the lines: `TextLineDataset` already drops every `\r`
    # (Windows line ends; tests/test_text_files.py holds it), and a map call
    # per line costs many times the reading (docs/performance.md).
    return tf.data.Dataset.zip(line_dataset(source_path), line_dataset(target_path))


def find_split_file(directory, split, lang):
    """The file for `split` and language `lang` in `directory`:
    `<prefix>.<lang>` or `<prefix>.<lang>.gz` for the first matching prefix of
    `split` (itself, then its `SPLIT_ALIASES`)."""
    if not os.path.isdir(directory):
        raise TextFileError(f"{directory}: no such directory of parallel text files.")
    prefixes = (split,) + tuple(p for p in SPLIT_ALIASES.get(split, ()) if p != split)
    for prefix in prefixes:
        for name in (f"{prefix}.{lang}", f"{prefix}.{lang}.gz"):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                return path
    available = sorted(n for n in os.listdir(directory) if not n.startswith("."))
    raise TextFileError(
        f"No file for split {split!r}, language {lang!r} in {directory}: tried "
        f"{[f'{p}.{lang}[.gz]' for p in prefixes]}; found {available}."
    )


def text_directory_source(directory, split, src_lang, tgt_lang, validate=True, **unused):
    """`(source_text, target_text)` pairs of one split of a directory of
    parallel files named `<split>.<lang>[.gz]` (e.g. Multi30k)."""
    return parallel_text_dataset(
        find_split_file(directory, split, src_lang),
        find_split_file(directory, split, tgt_lang),
        validate=validate,
    )
