"""Tab-separated parallel text: one pair per line, `source<TAB>target`,
plain or gzipped (gzip detected from the content). TensorFlow-only module.

Rules, checked once in Python by `count_pairs` (errors name the file and the
1-based line):

- every line holds exactly one tab, so two fields (an empty field is
  allowed); a line with no tab or with several is an error that gives the
  number of fields found and the line's start;
- every line decodes as UTF-8 and holds no NUL byte;
- the file is not empty;
- `\\n` or `\\r\\n` line ends (every `\\r` is dropped, as for text files).

The dataset then streams the file with `tf.data.TextLineDataset` and splits
the lines at the tab a batch of lines at a time, so files larger than memory
work and no Python runs per line.
"""

import tensorflow as tf

from keras_transformer.data.text_files import TextFileError, checked_lines, line_dataset

# Lines split per tf.data map call: a call per line costs many times the
# reading (docs/performance.md).
SPLIT_BATCH = 1024

# Characters of a bad line quoted in its error.
EXCERPT_CHARS = 60


class TsvError(TextFileError):
    """A TSV file is missing, empty, undecodable, or a line is not one pair."""


def _excerpt(text):
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def count_pairs(path):
    """Checks the TSV file `path` (module docstring) and returns its number
    of pairs (`int`, at least 1).

    Raises `TextFileError` (a `ValueError`) naming the file: missing, not
    readable as text or gzip, or empty; `TextFileError` naming the file and
    the line for invalid UTF-8 or a NUL byte; `TsvError` naming the file,
    the line, the number of fields found and an excerpt for a line without
    exactly one tab.
    """
    count = 0
    for count, raw in checked_lines(path, expected="UTF-8 text, one `source<TAB>target` "
                                                   "pair per line"):
        tabs = raw.count(b"\t")
        if tabs != 1:
            line = raw.decode("utf-8").rstrip("\r\n").replace("\r", "")
            raise TsvError(
                f"{path}, line {count}: expected 2 tab-separated fields (source, target), "
                f"found {tabs + 1}: {_excerpt(line)!r}."
            )
    if count == 0:
        raise TsvError(f"{path}: the file is empty; expected one `source<TAB>target` pair "
                       "per line.")
    return count


def tsv_dataset(path, validate=True):
    """`(source_text, target_text)` pairs of a TSV file.

    Args:
        path: plain or gzipped UTF-8 file, one `source<TAB>target` per line.
        validate: check the file first (`count_pairs`). Unchecked, a line
            without a tab gives an empty target and one with several tabs
            keeps the later ones in the target.

    Returns: a `tf.data.Dataset` of `(tf.string [], tf.string [])` in file
    order, without `\\r`.
    """
    if validate:
        count_pairs(path)

    def split(lines):
        fields = tf.strings.split(lines, sep="\t", maxsplit=1)
        fields = fields.to_tensor(default_value="", shape=[None, 2])
        return fields[:, 0], fields[:, 1]

    # Batch, split, unbatch: the same order as line by line.
    return (
        line_dataset(path)
        .batch(SPLIT_BATCH)
        .map(split, num_parallel_calls=tf.data.AUTOTUNE)
        .unbatch()
    )
