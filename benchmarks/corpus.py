"""Translating a big file with kt-translate (`keras_transformer/streaming.py`):
peak resident memory at N and 10 N lines, sentences/s against one window
holding the whole input (how kt-translate read a file before it streamed:
all of it sorted and translated at once, written at the end; streaming
translates its default two windows at once), and the time
a job killed halfway takes to resume. With `--beam-python` (a Python with
the `beam` extra, e.g. .venv-beam/bin/python) and a SavedModel, it also
times the Beam pipeline (`keras_transformer.beam`) on the DirectRunner with
2 workers against streaming kt-translate on the same N lines, rounds
alternating, and checks that both write the same translations.

    python -m benchmarks corpus --saved-model saved_models/demo
    python -m benchmarks corpus --ctranslate2-model DIR --lines 10000
    python -m benchmarks corpus --run-dir runs/demo --lines 10000 --large-lines 20000
    python -m benchmarks corpus --saved-model saved_models/demo \\
        --beam-python .venv-beam/bin/python --parts beam

Each measurement is one `kt-translate` process (its peak RSS from
`getrusage` of the children); the input is the built-in corpus generator's
sentences, all different (up to 100,000). The two runs alternate over
`--rounds`.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import harness


def write_input(path, lines, distinct=100_000):
    """`lines` sentences of the built-in corpus generator, all different up
    to `distinct` (then repeated): copies of a sentence sorted into one
    batch would end their searches together and flatter the larger
    windows."""
    from keras_transformer.data.synthetic import generate_corpus

    sentences = generate_corpus(seed=5, num_train=min(lines, distinct), num_val=1,
                                num_test=1)["train"][0]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            f.write(sentences[i % len(sentences)] + "\n")


def kt_translate(model, source, output, *flags):
    return [sys.executable, "-m", "keras_transformer.cli.translate", *model, "--input", source,
            "--output", output, "--quiet", *flags]


def measured(command):
    """`run(command)` in a fresh Python process, so that RUSAGE_CHILDREN's
    maximum is this command's alone."""
    probe = ("import resource,subprocess,sys,time;s=time.monotonic();"
             "r=subprocess.run(sys.argv[1:]);"
             "print(time.monotonic()-s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
             "sys.exit(r.returncode)")
    done = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}\n{done.stderr[-3000:]}")
    seconds, kib = done.stdout.split()[-2:]
    return float(seconds), int(kib) / 1024


def resume_after_kill(command, output, lines, fraction=0.5):
    """Seconds the rerun takes after `command` is killed once `fraction` of
    `lines` are done (its finished windows counted in `output.parts/`)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = output + ".parts"
    window = int(command[command.index("--window") + 1])
    wanted = int(lines * fraction) // window
    while process.poll() is None:
        if os.path.isdir(parts) and len(os.listdir(parts)) - 1 >= wanted:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = len(os.listdir(parts)) - 1
    seconds, _ = measured(command)
    return {"windows_done_at_kill": done, "resume_seconds": round(seconds, 1)}


def beam_direct(python, saved_model, source, output_dir, batch_size):
    return [python, "-m", "keras_transformer.beam", "--saved-model", saved_model,
            "--input", source, "--output-dir", output_dir, "--max-batch-size", str(batch_size),
            "--runner", "DirectRunner", "--direct_num_workers", "2",
            "--direct_running_mode", "multi_processing"]


def alternating_rounds(rounds, commands, lines, check=None):
    """`rounds` rounds of the two commands of `commands(r)` (`{name:
    command}`, the ratio's numerator first), in an order that flips every
    round, each timed by `measured`; `check(r)`, if given, runs after each
    round. Returns the rounds, each `{name: {sentences_per_second,
    seconds, peak_rss_mib}, "ratio": first / second}`."""
    result = []
    for r in range(rounds):
        named = commands(r)
        names = list(named)
        pair = {}
        for name in names if r % 2 == 0 else names[::-1]:
            seconds, peak = measured(named[name])
            pair[name] = {"sentences_per_second": round(lines / seconds, 1),
                          "seconds": round(seconds, 1), "peak_rss_mib": round(peak)}
        if check is not None:
            check(r)
        pair["ratio"] = round(pair[names[0]]["sentences_per_second"]
                              / pair[names[1]]["sentences_per_second"], 3)
        result.append(pair)
        print("round", r, pair, flush=True)
    return result


def beam_rounds(args, flags, small, work, streaming):
    """Sentences/s of the Beam DirectRunner (2 workers) and of streaming
    kt-translate on `small`, alternating; raises if their translations
    differ."""
    streamed = os.path.join(work, "s.out")

    def commands(r):
        return {"beam": beam_direct(args.beam_python, args.saved_model, small,
                                    os.path.join(work, f"beam{r}"), args.batch_size),
                "streaming": kt_translate(flags, small, streamed, *streaming)}

    def same_translations(r):
        out_dir = os.path.join(work, f"beam{r}")
        shards = sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir))
        beam = "".join(open(p, encoding="utf-8").read() for p in shards)
        if beam != open(streamed, encoding="utf-8").read():
            raise RuntimeError("the Beam pipeline's translations differ from kt-translate's")

    return alternating_rounds(args.rounds, commands, args.lines, same_translations)


def main(argv=None):
    parser = harness.parser(__doc__, prog="python -m benchmarks corpus")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--run-dir")
    model.add_argument("--saved-model")
    model.add_argument("--ctranslate2-model")
    parser.add_argument("--lines", type=int, default=10_000,
                        help="N: memory at N and 10 N lines; throughput on N")
    parser.add_argument("--large-lines", type=int, default=None,
                        help="the larger input of the memory comparison (default: 10 N)")
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--beam-python",
                        help="a Python with the beam extra: also time the Beam DirectRunner")
    parser.add_argument("--parts", default="memory,throughput,resume,beam",
                        help="comma-separated: memory, throughput, resume, beam")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    parts = harness.parts(parser, args.parts, ["memory", "throughput", "resume", "beam"],
                          "--parts")
    if "beam" in parts and args.beam_python and not args.saved_model:
        parser.error("--beam-python needs --saved-model: the pipeline runs a SavedModel")
    flags = next([flag, value] for flag, value in (("--run-dir", args.run_dir),
                                                    ("--saved-model", args.saved_model),
                                                    ("--ctranslate2-model",
                                                     args.ctranslate2_model)) if value)
    work = tempfile.mkdtemp(prefix="kt-corpus-")
    small, large = os.path.join(work, "small.txt"), os.path.join(work, "large.txt")
    write_input(small, args.lines)
    if "memory" in parts:
        write_input(large, args.large_lines or 10 * args.lines)
    batch = ["--batch-size", str(args.batch_size)]
    streaming = ["--window", str(args.window), *batch]
    whole = ["--window", str(args.lines + 1), "--parallel-windows", "1", *batch]
    document = {"kind": "corpus", "model": flags, "args": vars(args)}
    if "memory" in parts:
        memory = {}
        for name, source in (("small", small), ("large", large)):
            seconds, peak = measured(kt_translate(flags, source,
                                                  os.path.join(work, name + ".out"), *streaming))
            memory[name] = {"lines": sum(1 for _ in open(source)), "peak_rss_mib": round(peak),
                            "seconds": round(seconds, 1)}
            print(name, memory[name], flush=True)
        document["memory"] = memory
        document["memory_growth_mib"] = (memory["large"]["peak_rss_mib"]
                                         - memory["small"]["peak_rss_mib"])
    if "throughput" in parts:
        rounds = alternating_rounds(args.rounds, lambda r: {
            "streaming": kt_translate(flags, small, os.path.join(work, "t.out"), *streaming),
            "whole": kt_translate(flags, small, os.path.join(work, "t.out"), *whole)},
            args.lines)
        document["throughput_rounds"] = rounds
        document["streaming_over_whole_median"] = statistics.median(r["ratio"] for r in rounds)
    if "resume" in parts:
        resume_output = os.path.join(work, "resume.out")
        resume = resume_after_kill(kt_translate(flags, small, resume_output, *streaming),
                                   resume_output, args.lines)
        if "memory" in parts:
            resume["uninterrupted_seconds"] = document["memory"]["small"]["seconds"]
        print("resume", resume, flush=True)
        document["resume"] = resume
    if "beam" in parts and args.beam_python:
        rounds = beam_rounds(args, flags, small, work, streaming)
        document["beam_rounds"] = rounds
        document["beam_over_streaming_median"] = statistics.median(r["ratio"] for r in rounds)
    fields = harness.record()
    document = {**fields, **document}
    print(json.dumps({k: v for k, v in document.items() if k.endswith(("median", "growth_mib"))}))
    harness.write_result(document, fields, "corpus", args.json)
