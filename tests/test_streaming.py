"""Translating big files (`keras_transformer/streaming.py`, kt-translate):
lines read one window at a time, output in input order, a killed job
resumed after its last finished window with the same bytes as an
uninterrupted run, never a partial file under the output's name, and the
progress bar on a terminal only."""

import gzip
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from keras_transformer import streaming
from support.processes import ENV, ROOT
from support.serving_model import export_tiny_model


def test_lines_come_one_at_a_time_without_endings(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo\n\n\xff bad\nlast")
    assert list(streaming.iter_lines(str(path))) == [b"one", b"two", b"", b"\xff bad",
                                                     b"last"]
    assert streaming.count_lines(str(path)) == 5
    packed = tmp_path / "in.txt.gz"
    with gzip.open(packed, "wb") as f:
        f.write(b"a\nb\n")
    assert list(streaming.iter_lines(str(packed))) == [b"a", b"b"]
    assert streaming.count_lines(str(packed)) == 2
    (tmp_path / "empty").write_bytes(b"")
    assert streaming.count_lines(str(tmp_path / "empty")) == 0
    assert list(streaming.windows(iter("abcde"), 2)) == [["a", "b"], ["c", "d"], ["e"]]
    with pytest.raises(ValueError, match="window must be at least 1"):
        list(streaming.windows([], 0))


def _echo(calls):
    def translate_window(lines, first):
        calls.append((first, len(lines)))
        return [f"{first + i}:{line.decode()}" for i, line in enumerate(lines)]
    return translate_window


def test_a_job_resumes_after_its_last_finished_window(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("".join(f"s{i}\n" for i in range(10)))
    output = str(tmp_path / "out.txt")
    calls = []

    def dies_in_window_3(lines, first):
        if first == 6:
            raise KeyboardInterrupt  # the job is stopped in its fourth window
        return _echo(calls)(lines, first)

    with pytest.raises(KeyboardInterrupt):
        streaming.translate_file(dies_in_window_3, str(source), output, window=2,
                                 job={"beam": 4}, quiet=True)
    assert not os.path.exists(output)  # no partial file under the output's name
    assert sorted(os.listdir(output + ".parts")) == [
        "00000000.txt", "00000001.txt", "00000002.txt", "job.json"]
    # Another command is refused, naming what differs; its parts stay.
    with pytest.raises(ValueError, match=r"out.txt.parts holds the finished windows of "
                                         r"another job \(it differs in beam\)"):
        streaming.translate_file(_echo([]), str(source), output, window=2, job={"beam": 5})
    calls.clear()
    assert streaming.translate_file(_echo(calls), str(source), output, window=2,
                                    job={"beam": 4}, quiet=True) == 10
    assert sorted(calls) == [(6, 2), (8, 2)]  # only the windows not finished before
    assert open(output).read() == "".join(f"{i}:s{i}\n" for i in range(10))
    assert not os.path.exists(output + ".parts")
    # The same from stdout, in one go.
    printed = []

    class Out:
        def write(self, text):
            printed.append(text)

        def flush(self):
            pass

    streaming.translate_file(_echo([]), str(source), "-", window=3, stdout=Out())
    assert "".join(printed) == open(output).read()


def test_two_windows_are_translated_at_once_and_written_in_input_order(tmp_path):
    """With the default `in_flight` 2, the first two windows are in
    `translate_window` at the same time (a barrier that times out
    otherwise); the first finishes last, yet is written first. With 1,
    never two at once."""
    import threading

    source = tmp_path / "in.txt"
    source.write_text("".join(f"s{i}\n" for i in range(7)))
    both_in = threading.Barrier(2, timeout=30)
    first_done = threading.Event()
    running, most = [0], [0]
    lock = threading.Lock()

    def overlapping(lines, first):
        if first < 4:  # windows 0 and 1
            both_in.wait()
            if first == 0:
                time.sleep(0.2)
                first_done.set()
            else:
                assert not first_done.is_set()
        return _echo([])(lines, first)

    assert streaming.DEFAULT_IN_FLIGHT == 2
    output = str(tmp_path / "out.txt")
    streaming.translate_file(overlapping, str(source), output, window=2, quiet=True)
    assert open(output).read() == "".join(f"{i}:s{i}\n" for i in range(7))

    def counted(lines, first):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return _echo([])(lines, first)

    one = str(tmp_path / "one.txt")
    streaming.translate_file(counted, str(source), one, window=2, quiet=True, in_flight=1)
    assert most[0] == 1 and open(one).read() == open(output).read()


def test_parallel_windows_default_by_engine():
    import argparse

    from keras_transformer.cli.common import parallel_windows
    from keras_transformer.cli.translate import build_parser

    parser = build_parser()
    for engine, expected in (("tensorflow", 2), ("ctranslate2", 1), ("litert", 1)):
        args = argparse.Namespace(engine=engine, parallel_windows=None)
        assert parallel_windows(parser, args) == expected
        args.parallel_windows = 3
        assert parallel_windows(parser, args) == 3
    with pytest.raises(SystemExit):
        parallel_windows(parser, argparse.Namespace(engine="tensorflow", parallel_windows=0))


def test_in_order_example_runs_and_errors_surface_in_order():
    import doctest

    finder = doctest.DocTestFinder()
    (example,) = finder.find(streaming.in_order)
    runner = doctest.DocTestRunner()
    runner.run(example)
    assert runner.failures == 0

    def fails_on_2(n):
        if n == 2:
            raise ValueError("item 2")
        return n

    got = []
    with pytest.raises(ValueError, match="item 2"):
        for value in streaming.in_order(fails_on_2, range(6), in_flight=2):
            got.append(value)
    assert got == [0, 1]
    with pytest.raises(ValueError, match="in_flight must be at least 1"):
        list(streaming.in_order(fails_on_2, [], in_flight=0))


def test_a_changed_input_is_not_resumed(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("a\nb\nc\n")
    output = str(tmp_path / "out.txt")
    streaming.ResumableOutput(output, {"window": 2,
                                       "input": streaming.input_identity(str(source))})
    source.write_text("a\nb\nc\nd\n")
    with pytest.raises(ValueError, match="differs in input"):
        streaming.translate_file(_echo([]), str(source), output, window=2)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return os.path.dirname(export_tiny_model(tmp_path_factory.mktemp("stream")))


def _kt_translate(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "keras_transformer.cli.translate", *args],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


def _corpus(path, count=240):
    words = "the dog sees a cat near the red house".split()
    path.write_text("".join(" ".join(words[(i * 5) % 9:(i * 5) % 9 + 1 + i % 7]) + "\n"
                            for i in range(count)))
    return str(path)


@pytest.mark.e2e
def test_a_killed_kt_translate_resumes_with_the_same_bytes(exported, tmp_path):
    flags = ["--saved-model", exported, "--input", _corpus(tmp_path / "in.txt"),
             "--window", "16", "--batch-size", "8"]
    # One window after another here, two at once (the default) below.
    whole = _kt_translate(*flags, "--output", str(tmp_path / "whole.txt"),
                          "--parallel-windows", "1")
    output = tmp_path / "out.txt"
    killed = _kt_translate(*flags, "--output", str(output))
    parts = str(output) + ".parts"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and killed.poll() is None:
        assert not output.exists()
        if os.path.isdir(parts) and len(os.listdir(parts)) >= 4:  # job.json and 3 windows
            break
        time.sleep(0.05)
    assert killed.poll() is None, killed.communicate()[1].decode()[-2000:]
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert not output.exists()
    done = len(os.listdir(parts)) - 1
    assert 3 <= done < 15, done
    again = _kt_translate(*flags, "--output", str(output))
    assert again.wait(timeout=300) == 0, again.communicate()[1].decode()[-2000:]
    assert whole.wait(timeout=300) == 0, whole.communicate()[1].decode()[-2000:]
    assert output.read_bytes() == (tmp_path / "whole.txt").read_bytes()
    assert output.read_bytes().count(b"\n") == 240
    assert not os.path.exists(parts)


@pytest.mark.parametrize("mode", [["--n-best", "2"],
                                  ["--sampling", "--seed", "3", "--temperature", "0.9"]])
def test_n_best_and_samples_resume_with_the_same_bytes(exported, tmp_path, monkeypatch,
                                                       mode):
    from keras_transformer.cli import translate
    from keras_transformer.export.saved_model import open_translator

    # The three runs share one loaded SavedModel, as three commands would
    # each load the same one.
    loaded = open_translator(saved_model=exported)
    monkeypatch.setattr(translate, "open_from_args", lambda args: loaded)
    flags = ["--saved-model", exported, "--input", _corpus(tmp_path / "in.txt", 24),
             "--window", "4", "--batch-size", "4", "--quiet", *mode]
    # One window after another here, two at once (the default) below.
    translate.translate(flags + ["--output", str(tmp_path / "whole.txt"),
                                 "--parallel-windows", "1"], collect=False)
    with open(tmp_path / "whole.txt", encoding="utf-8", newline="") as f:
        whole = f.read().split("\n")[:-1]  # a sample may hold other line breaks
    # The library's result keeps the input's order too.
    collected = translate.translate(flags + ["--output", str(tmp_path / "collected.txt")])
    if mode[0] == "--n-best":
        assert [f"{i} ||| {streaming.one_line(t)} ||| {s:.4f}"
                for i, row in enumerate(collected) for t, s in row] == whole
    else:
        assert [streaming.one_line(t) for t in collected[0]] == whole
    write = streaming.ResumableOutput.write

    def stops_at_window_3(self, index, text):
        if index == 3:
            raise KeyboardInterrupt
        write(self, index, text)

    output = str(tmp_path / "out.txt")
    monkeypatch.setattr(streaming.ResumableOutput, "write", stops_at_window_3)
    with pytest.raises(KeyboardInterrupt):
        translate.translate(flags + ["--output", output], collect=False)
    assert not os.path.exists(output) and len(os.listdir(output + ".parts")) == 4
    monkeypatch.setattr(streaming.ResumableOutput, "write", write)
    translate.translate(flags + ["--output", output], collect=False)
    assert open(output, "rb").read() == open(tmp_path / "whole.txt", "rb").read()
    lines = open(output, "rb").read().count(b"\n")
    assert lines == 24 * (2 if mode[0] == "--n-best" else 1)


PROGRAM = """
import sys
from keras_transformer import streaming
streaming.translate_file(lambda lines, first: [l.decode() for l in lines], sys.argv[1],
                         sys.argv[2], window=50)
"""


def test_the_progress_bar_shows_on_a_terminal_only(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("x\n" * 300)
    command = [sys.executable, "-c", PROGRAM, str(source), str(tmp_path / "out.txt")]
    main, secondary = pty.openpty()
    process = subprocess.Popen(command, cwd=ROOT, env=ENV, stderr=secondary,
                               stdout=subprocess.DEVNULL)
    os.close(secondary)
    shown = b""
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        try:
            chunk = os.read(main, 4096) if ready else b""
        except OSError:  # the terminal closed with the process
            chunk = b""
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert process.wait(timeout=60) == 0
    assert b"300/300" in shown and b"lines/s" in shown, shown[-500:]
    piped = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, timeout=120)
    assert piped.returncode == 0 and b"lines/s" not in piped.stderr, piped.stderr[-500:]
    assert (tmp_path / "out.txt").read_text() == "x\n" * 300


def test_split_sentences_translates_each_sentence_of_a_line(exported, tmp_path, monkeypatch,
                                                            capsys):
    from keras_transformer.cli import translate
    from keras_transformer.export.saved_model import open_translator

    loaded = open_translator(saved_model=exported)
    monkeypatch.setattr(translate, "open_from_args", lambda args: loaded)
    source = tmp_path / "doc.txt"
    source.write_text("the dog sees a cat. a red house!\n\nMr. Smith sees the boat.\n")
    found, _ = translate.translate(["--saved-model", exported, "--input", str(source),
                                    "--split-sentences", "en", "--window", "2"])
    alone, _ = loaded.translate(["the dog sees a cat.", "a red house!",
                                 "Mr. Smith sees the boat."])
    assert found == [f"{alone[0]} {alone[1]}", "", alone[2]]
    for flags, message in [(["--split-sentences", "xx"], "--split-sentences: no sentence "
                                                         "splitter for language 'xx'"),
                           (["--split-sentences", "en", "--n-best", "2"],
                            "--n-best does not apply to --split-sentences")]:
        with pytest.raises(SystemExit):
            translate.translate(["--saved-model", exported, *flags])
        assert message in capsys.readouterr().err
