"""Data by path: `sources.pairs_from_paths` over two aligned files or one
TSV file (keras_transformer/data/tsv.py), and their errors."""

import gzip

import pytest
import tensorflow as tf

from keras_transformer.data import sources, tsv
from keras_transformer.data.text_files import TextFileError
from keras_transformer.data.tsv import TsvError
from support.timing import best_cpu_seconds

EN = ["A dog runs.", "Two men, one boat.", "Größe ist relativ.", ""]
DE = ["Ein Hund rennt.", "Zwei Männer, ein Boot.", "Size is relative.", "leer"]


def write(path, raw, gz=False):
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(raw)
    return str(path)


def tsv_bytes(pairs, end="\n"):
    return "".join(f"{s}\t{t}{end}" for s, t in pairs).encode("utf-8")


def read_pairs(dataset):
    return [(s.decode(), t.decode()) for s, t in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_reads_plain_and_gzipped_tsv_with_either_line_end(tmp_path, gz, end):
    # The name says nothing: gzip is detected from the content.
    path = write(tmp_path / "corpus.txt", tsv_bytes(zip(EN, DE), end), gz)
    assert sources.count_pairs(tsv=path) == 4
    assert read_pairs(sources.pairs_from_paths(tsv=path)) == list(zip(EN, DE))


def test_order_is_kept_across_split_batches(tmp_path):
    pairs = [(f"source {i}", f"target {i} ✓") for i in range(2 * tsv.SPLIT_BATCH + 17)]
    path = write(tmp_path / "big.tsv", tsv_bytes(pairs))
    dataset = sources.pairs_from_paths(tsv=path)
    assert dataset.element_spec == (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string))
    assert read_pairs(dataset) == pairs


def test_a_file_without_a_final_line_end(tmp_path):
    path = write(tmp_path / "a.tsv", b"one\teins\ntwo\tzwei")
    assert tsv.count_pairs(path) == 2
    assert read_pairs(tsv.tsv_dataset(path)) == [("one", "eins"), ("two", "zwei")]


def test_lines_are_not_split_one_by_one(tmp_path):
    # A map call per line costs many times the reading (docs/performance.md).
    # The reference, line by line, runs in the same process
    # (support/timing.py).
    pairs = [(f"sentence number {i}", f"Satz Nummer {i}") for i in range(6000)]
    path = write(tmp_path / "a.tsv", tsv_bytes(pairs))

    def split_line(line):
        fields = tf.strings.split(line, sep="\t", maxsplit=1)
        return fields[0], fields[1]

    def read(dataset):
        return lambda: [p for batch in dataset.batch(1024).as_numpy_iterator()
                        for p in zip(*batch)]

    seconds, got = best_cpu_seconds({
        "reference": read(tf.data.TextLineDataset(path).map(split_line)),
        "ours": read(tsv.tsv_dataset(path, validate=False))})
    assert got["ours"] == got["reference"]
    assert got["ours"][5] == (b"sentence number 5", b"Satz Nummer 5")
    assert seconds["ours"] * 2 < seconds["reference"], seconds


@pytest.mark.parametrize("line, fields", [
    (b"no tab at all", 1),
    (b"one\ttwo\tthree", 3),
    (b"a\tb\tc\td\r", 4),
])
def test_a_line_without_exactly_one_tab_names_file_line_and_fields(tmp_path, line, fields):
    path = write(tmp_path / "bad.tsv", b"fine\tgut\nalso fine\tauch gut\n" + line + b"\nok\tok\n")
    excerpt = line.decode().rstrip("\r").split("\t")[0]
    with pytest.raises(TsvError, match=rf"bad\.tsv, line 3: expected 2 tab-separated fields "
                                       rf"\(source, target\), found {fields}: '{excerpt}"):
        sources.pairs_from_paths(tsv=path)


def test_an_empty_line_is_a_bad_line(tmp_path):
    path = write(tmp_path / "gap.tsv", b"one\teins\n\ntwo\tzwei\n")
    with pytest.raises(TsvError, match=r"gap\.tsv, line 2: .*found 1: ''"):
        tsv.count_pairs(path)


def test_a_long_bad_line_is_quoted_shortened(tmp_path):
    path = write(tmp_path / "long.tsv", ("x" * 500).encode() + b"\n")
    with pytest.raises(TsvError) as raised:
        tsv.count_pairs(path)
    assert "long.tsv, line 1" in str(raised.value) and "x" * 60 + "...'" in str(raised.value)
    assert len(str(raised.value)) < 300


def test_a_file_of_only_bad_lines_is_reported_at_the_first(tmp_path):
    # Not an "empty training set" later: the first line is named.
    path = write(tmp_path / "all_bad.tsv.gz", b"first bad\nsecond bad\n", gz=True)
    with pytest.raises(TsvError, match=r"all_bad\.tsv\.gz, line 1: .*found 1: 'first bad'"):
        sources.pairs_from_paths(tsv=path)


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = write(tmp_path / "latin1.tsv", b"ok\tgut\nsch\xf6n\tbeautiful\n", gz=True)
    with pytest.raises(TextFileError, match=r"latin1\.tsv, line 2: not valid UTF-8.*"
                                            r"source<TAB>target"):
        sources.pairs_from_paths(tsv=path)


def test_empty_and_missing_files(tmp_path):
    empty = write(tmp_path / "empty.tsv", b"")
    with pytest.raises(TsvError, match=r"empty\.tsv: the file is empty"):
        sources.pairs_from_paths(tsv=empty)
    with pytest.raises(TsvError, match=r"empty\.tsv: the file is empty"):
        sources.count_pairs(tsv=empty)
    with pytest.raises(TextFileError, match=r"nope\.tsv: no such file"):
        sources.pairs_from_paths(tsv=str(tmp_path / "nope.tsv"))
    with pytest.raises(TextFileError, match=r"broken\.tsv: cannot be read"):
        sources.count_pairs(tsv=write(tmp_path / "broken.tsv", b"\x1f\x8bnot gzip"))


def test_unvalidated_lines_keep_their_fields(tmp_path):
    # validate=False skips the Python pass; a bad line still gives a pair.
    path = write(tmp_path / "u.tsv", b"a\tb\nno tab\nx\ty\tz\n")
    assert read_pairs(sources.pairs_from_paths(tsv=path, validate=False)) == [
        ("a", "b"), ("no tab", ""), ("x", "y\tz")]


@pytest.mark.parametrize("gz", [False, True])
def test_two_aligned_files_by_path(tmp_path, gz):
    src = write(tmp_path / "corpus.source", ("\n".join(EN) + "\n").encode(), gz)
    tgt = write(tmp_path / "other_name", ("\r\n".join(DE) + "\r\n").encode())
    assert sources.count_pairs(source=src, target=tgt) == 4
    assert read_pairs(sources.pairs_from_paths(source=tmp_path / "corpus.source",
                                               target=tgt)) == list(zip(EN, DE))


def test_aligned_file_errors_name_file_and_line(tmp_path):
    src = write(tmp_path / "s.txt", b"one\ntwo\nthree\n")
    short = write(tmp_path / "t.txt", b"eins\nzwei\n")
    with pytest.raises(TextFileError, match=r"s\.txt has 3 lines, .*t\.txt has 2; line 3"):
        sources.pairs_from_paths(source=src, target=short)
    bad = write(tmp_path / "u.txt", b"eins\nzwei\ndr\xffei\n")
    with pytest.raises(TextFileError, match=r"u\.txt, line 3: not valid UTF-8"):
        sources.count_pairs(source=src, target=bad)
    empty = write(tmp_path / "e.txt", b"")
    with pytest.raises(TextFileError, match=r"e\.txt: the file is empty"):
        sources.pairs_from_paths(source=empty, target=src)


@pytest.mark.parametrize("kwargs, named", [
    ({}, "nothing"),
    ({"source": "a"}, "source"),
    ({"target": "b"}, "target"),
    ({"source": "a", "target": "b", "tsv": "c"}, "source and target and tsv"),
    ({"source": "a", "tsv": "c"}, "source and tsv"),
])
def test_exactly_one_form(kwargs, named):
    for function in (sources.pairs_from_paths, sources.count_pairs):
        with pytest.raises(ValueError, match=rf"either `source` and `target`.* not {named}\."):
            function(**kwargs)


def test_data_specs_still_work(tmp_path):
    write(tmp_path / "train.en", b"a\nb\n")
    write(tmp_path / "train.de", b"x\ny\n")
    assert read_pairs(sources.load_pairs(f"text:{tmp_path}", "train", "en", "de")) == [
        ("a", "x"), ("b", "y")]
    assert sorted(sources.SOURCES) == ["builtin", "text", "tfds"]


def test_a_nul_byte_names_file_and_line(tmp_path):
    # UTF-16 text decodes as UTF-8 (ASCII and NUL bytes): the NUL gives it away.
    path = write(tmp_path / "utf16.tsv", b"ok\tgut\n" + "a\tb\n".encode("utf-16-le"), gz=True)
    with pytest.raises(TextFileError, match=r"utf16\.tsv, line 2: a NUL byte at byte 1 "
                                            r".*source<TAB>target"):
        sources.count_pairs(tsv=path)
