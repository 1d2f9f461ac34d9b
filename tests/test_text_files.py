import gzip
import os

import pytest
import tensorflow as tf

from keras_transformer.data import sources, text_files
from keras_transformer.data.text_files import TextFileError
from support.timing import best_cpu_seconds

MULTI30K = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "multi30k")

EN = ["A dog runs.", "Two men, one boat.", "Größe ist relativ."]
DE = ["Ein Hund rennt.", "Zwei Männer, ein Boot.", "Size is relative."]


def write(path, lines, gz=False, raw=None):
    data = raw if raw is not None else ("\n".join(lines) + "\n").encode("utf-8")
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(data)
    return str(path)


def read_pairs(dataset):
    return [(s.decode(), t.decode()) for s, t in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("gz", [False, True])
def test_reads_plain_and_gzipped_files(tmp_path, gz):
    suffix = ".gz" if gz else ""
    src = write(tmp_path / f"train.en{suffix}", EN, gz)
    tgt = write(tmp_path / f"train.de{suffix}", DE, gz)
    assert read_pairs(text_files.parallel_text_dataset(src, tgt)) == list(zip(EN, DE))


def test_gzip_is_detected_from_content_and_crlf_is_stripped(tmp_path):
    src = write(tmp_path / "a.en", None, gz=True, raw=b"one\r\ntwo\r\n")
    tgt = write(tmp_path / "a.de", None, raw=b"eins\r\nzwei\r\n")
    assert read_pairs(text_files.parallel_text_dataset(src, tgt)) == [("one", "eins"), ("two", "zwei")]


def test_every_carriage_return_is_dropped_plain_and_gzipped(tmp_path):
    # `parallel_text_dataset` has no `\r` stripping of its own: it relies on
    # `TextLineDataset` dropping them, line ends and inner ones alike.
    en = [f"line {i}" for i in range(6)]
    raw_en = "".join(f"{line}\r\n" if i % 2 else f"{line}\n" for i, line in enumerate(en))
    src = write(tmp_path / "a.en", None, raw=raw_en.encode())
    tgt = write(tmp_path / "a.de", [f"Zeile\r{i}\r" for i in range(6)], gz=True)
    assert read_pairs(text_files.parallel_text_dataset(src, tgt)) == [
        (line, f"Zeile{i}") for i, line in enumerate(en)]


def test_lines_are_not_mapped_one_by_one(tmp_path):
    # A map call per line costs many times the reading (docs/performance.md).
    # The reference, line by line, runs in the same process
    # (support/timing.py).
    lines = [f"sentence number {i}\r" for i in range(6000)]
    src = write(tmp_path / "a.en", lines)
    tgt = write(tmp_path / "a.de", lines)

    def per_line(path):
        return tf.data.TextLineDataset(path).map(
            lambda line: tf.strings.regex_replace(line, "\r$", ""))

    def read(dataset):
        return lambda: [p for batch in dataset.batch(1024).as_numpy_iterator()
                        for p in zip(*batch)]

    seconds, pairs = best_cpu_seconds({
        "reference": read(tf.data.Dataset.zip(per_line(src), per_line(tgt))),
        "ours": read(text_files.parallel_text_dataset(src, tgt, validate=False))})
    assert pairs["ours"] == pairs["reference"] and pairs["ours"][5][0] == b"sentence number 5"
    assert seconds["ours"] * 3 < seconds["reference"], seconds


def test_directory_source_finds_splits_by_alias(tmp_path):
    write(tmp_path / "train.en.gz", EN, gz=True)
    write(tmp_path / "train.de.gz", DE, gz=True)
    write(tmp_path / "val.en", EN[:1])
    write(tmp_path / "val.de", DE[:1])
    assert read_pairs(sources.load_pairs(f"text:{tmp_path}", "validation", "en", "de")) == [(EN[0], DE[0])]
    # Reverse direction from the same files.
    assert read_pairs(sources.load_pairs(f"text:{tmp_path}", "train", "de", "en"))[1] == (DE[1], EN[1])
    with pytest.raises(TextFileError, match=r"split 'test'.*found \['train.de.gz'"):
        sources.load_pairs(f"text:{tmp_path}", "test", "en", "de")


def test_mismatched_line_counts_name_both_files_and_the_line(tmp_path):
    src = write(tmp_path / "x.en", EN)
    tgt = write(tmp_path / "x.de", DE[:2])
    with pytest.raises(TextFileError, match=r"x.en has 3 lines, .*x.de has 2; line 3"):
        text_files.parallel_text_dataset(src, tgt)


def test_empty_file_is_rejected(tmp_path):
    src = write(tmp_path / "e.en", None, raw=b"")
    tgt = write(tmp_path / "e.de", DE)
    with pytest.raises(TextFileError, match=r"e.en: the file is empty"):
        text_files.parallel_text_dataset(src, tgt)


def test_undecodable_bytes_name_the_file_and_line(tmp_path):
    src = write(tmp_path / "b.en.gz", None, gz=True, raw=b"fine\nalso fine\nbad \xff\xfe byte\n")
    tgt = write(tmp_path / "b.de", DE)
    with pytest.raises(TextFileError, match=r"b.en.gz, line 3: not valid UTF-8"):
        text_files.parallel_text_dataset(src, tgt)


def test_a_nul_byte_names_the_file_and_line(tmp_path):
    src = write(tmp_path / "n.en", EN)
    tgt = write(tmp_path / "n.de", None, raw=b"Ein Hund.\nZwei\x00 M\xc3\xa4nner.\ndrei\n")
    with pytest.raises(TextFileError, match=r"n\.de, line 2: a NUL byte at byte 4 "
                                            r"\(b'Zwei\\x00 M"):
        text_files.parallel_text_dataset(src, tgt)


def test_missing_file_and_bad_gzip(tmp_path):
    with pytest.raises(TextFileError, match="no such file"):
        text_files.parallel_text_dataset(str(tmp_path / "nope.en"), str(tmp_path / "nope.de"))
    src = write(tmp_path / "t.en", None, raw=b"\x1f\x8bnot really gzip")
    with pytest.raises(TextFileError, match=r"t.en: cannot be read"):
        text_files.count_lines(src)


def test_unknown_source_kind():
    with pytest.raises(ValueError, match=r"Unknown data source 'csv'.*\['builtin', 'text', 'tfds'"):
        sources.load_pairs("csv:/x", "train", "en", "de")


@pytest.mark.multi30k
@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason="../shared/data/multi30k is absent")
def test_multi30k_layout():
    val = sources.load_pairs(f"text:{MULTI30K}", "validation", "en", "de")
    test = sources.load_pairs(f"text:{MULTI30K}", "test", "en", "de")
    pairs = read_pairs(val)
    assert len(pairs) == text_files.count_lines(text_files.find_split_file(MULTI30K, "val", "de"))
    assert all(s and t for s, t in pairs[:100])
    assert len(read_pairs(test)) == 1000
