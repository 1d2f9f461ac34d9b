"""A vocabulary map for CTranslate2 (`vmap.txt`): for each source piece, the
target pieces a translation of a sentence holding it is likely to use, so
that CTranslate2's `use_vmap=True` scores only those candidates (the union
over a batch's source pieces, plus the pieces always allowed) instead of the
whole target vocabulary at every decoding step.

Built from co-occurrence in the training corpus: a pair counts once for
each (source piece, target piece) it holds. A source piece keeps the
`per_source` target pieces whose share of its sentence pairs most exceeds
their share of all pairs (seen in at least `min_count` of its pairs); the
`always` target pieces found in the most pairs, and the special tokens,
are candidates for every sentence (the line with an empty source).

File format (CTranslate2's): one line per source piece, the piece, a tab,
then its target pieces separated by spaces; the first line has an empty
source. kt-export writes it as `vmap.txt` in the CTranslate2 directory.
"""

import collections
import os

__all__ = ["VOCABULARY_MAP_FILE", "build_vocabulary_map", "read_vocabulary_map",
           "write_vocabulary_map"]

VOCABULARY_MAP_FILE = "vmap.txt"


def count_cooccurrences(pairs, source_pieces, target_pieces):
    """`(pair count, source counts, target counts, joint counts)` of
    `pairs` (`(source text, target text)`), each piece counted once per
    pair; `source_pieces`/`target_pieces` map a text to its pieces."""
    total = 0
    source_counts, target_counts = collections.Counter(), collections.Counter()
    joint = collections.defaultdict(collections.Counter)
    for source, target in pairs:
        s, t = set(source_pieces(source)), set(target_pieces(target))
        total += 1
        source_counts.update(s)
        target_counts.update(t)
        for piece in s:
            joint[piece].update(t)
    return total, source_counts, target_counts, joint


def build_vocabulary_map(pairs, source_pieces, target_pieces, per_source=150, always=300,
                         min_count=2, special=()):
    """The map of `pairs` (see the module docstring).

    Args:
        pairs: iterable of `(source text, target text)`.
        source_pieces, target_pieces: `text -> list of pieces`.
        per_source: target pieces kept per source piece.
        always: the most frequent target pieces allowed for every sentence.
        min_count: pairs a (source, target) piece pair must share.
        special: target tokens always allowed (e.g. eos, unk).

    Returns: `{source piece: [target pieces]}`, with key "" for the pieces
    always allowed.

    Example:

    ```python
    from keras_transformer.export.vocabulary_map import build_vocabulary_map

    pairs = [("a dog", "ein hund"), ("a cat", "eine katze"), ("the dog", "der hund"),
             ("the cat", "die katze")] * 2
    mapping = build_vocabulary_map(pairs, str.split, str.split, per_source=1, always=0)
    assert mapping["dog"] == ["hund"] and mapping["cat"] == ["katze"]
    ```
    """
    if per_source < 1 or always < 0 or min_count < 1:
        raise ValueError(f"per_source must be >= 1, always >= 0 and min_count >= 1, received "
                         f"{per_source}, {always}, {min_count}.")
    total, source_counts, target_counts, joint = count_cooccurrences(
        pairs, source_pieces, target_pieces)
    if total == 0:
        raise ValueError("A vocabulary map needs at least one sentence pair.")
    frequent = [t for t, _ in sorted(target_counts.items(), key=lambda kv: (-kv[1], kv[0]))
                [:always]]
    fixed = list(dict.fromkeys([*special, *frequent]))
    mapping = {"": fixed}
    for piece, counts in joint.items():
        share = source_counts[piece]
        scored = [((count / share) - target_counts[t] / total, t)
                  for t, count in counts.items() if count >= min_count]
        scored.sort(key=lambda st: (-st[0], st[1]))
        kept = [t for score, t in scored[:per_source] if score > 0]
        if kept:
            mapping[piece] = kept
    return mapping


def write_vocabulary_map(path, mapping):
    r"""Writes `mapping` in CTranslate2's format (the "" line first).
    Pieces may hold no tab, space or newline. Returns `path`.

    Example:

    ```python
    import os
    import tempfile

    from keras_transformer.export.vocabulary_map import write_vocabulary_map

    path = os.path.join(tempfile.mkdtemp(), "vmap.txt")
    write_vocabulary_map(path, {"▁dog": ["▁Hund"], "": ["."]})
    assert open(path, encoding="utf-8").read() == "\t.\n▁dog\t▁Hund\n"
    ```
    """
    lines = []
    for source in sorted(mapping, key=lambda s: (s != "", s)):
        for piece in [source, *mapping[source]]:
            if any(c in piece for c in "\t \n"):
                raise ValueError(f"A vocabulary map piece holds whitespace: {piece!r}.")
        lines.append(f"{source}\t{' '.join(mapping[source])}\n")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return os.fspath(path)


def read_vocabulary_map(path):
    """`{source piece: [target pieces]}` of a file `write_vocabulary_map`
    wrote; `ValueError` naming the file and line for a line without a tab.

    Example:

    ```python
    import os
    import tempfile

    from keras_transformer.export.vocabulary_map import (
        read_vocabulary_map,
        write_vocabulary_map,
    )

    path = write_vocabulary_map(os.path.join(tempfile.mkdtemp(), "vmap.txt"),
                                {"▁dog": ["▁Hund", "▁Hunde"], "": []})
    assert read_vocabulary_map(path) == {"": [], "▁dog": ["▁Hund", "▁Hunde"]}
    ```
    """
    mapping = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            source, tab, targets = line.rstrip("\n").partition("\t")
            if not tab:
                raise ValueError(f"{path}:{number}: no tab between the source piece and its "
                                 "target pieces.")
            mapping[source] = targets.split()
    return mapping
