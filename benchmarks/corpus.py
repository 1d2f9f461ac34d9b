"""Translating a big file with kt-translate (`keras_transformer/streaming.py`):
peak resident memory at N and 10 N lines, sentences/s against one window
holding the whole input (how kt-translate read a file before it streamed:
all of it sorted and translated at once, written at the end), and the time
a job killed halfway takes to resume.

    python -m benchmarks corpus --saved-model saved_models/demo
    python -m benchmarks corpus --ctranslate2-model DIR --lines 10000

Each measurement is one `kt-translate` process (its peak RSS from
`getrusage` of the children); the input is the built-in corpus generator's
sentences, repeated to length. The two throughput runs alternate over
`--rounds`.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import provenance


def write_input(path, lines):
    from keras_transformer.data.synthetic import generate_corpus

    sentences = generate_corpus(seed=5, num_train=2000, num_val=1, num_test=1)["train"][0]
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks corpus",
                                     description=__doc__.split("\n\n")[0], allow_abbrev=False)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--saved-model")
    model.add_argument("--ctranslate2-model")
    parser.add_argument("--lines", type=int, default=10_000,
                        help="N: memory at N and 10 N lines; throughput on N")
    parser.add_argument("--large-lines", type=int, default=None,
                        help="the larger input of the memory comparison (default: 10 N)")
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    flags = (["--saved-model", args.saved_model] if args.saved_model
             else ["--ctranslate2-model", args.ctranslate2_model])
    work = tempfile.mkdtemp(prefix="kt-corpus-")
    small, large = os.path.join(work, "small.txt"), os.path.join(work, "large.txt")
    write_input(small, args.lines)
    large_lines = args.large_lines or 10 * args.lines
    write_input(large, large_lines)
    batch = ["--batch-size", str(args.batch_size)]
    streaming = ["--window", str(args.window), *batch]
    whole = ["--window", str(args.lines + 1), *batch]
    memory = {}
    for name, source in (("small", small), ("large", large)):
        seconds, peak = measured(kt_translate(flags, source, os.path.join(work, name + ".out"),
                                              *streaming))
        memory[name] = {"lines": sum(1 for _ in open(source)), "peak_rss_mib": round(peak),
                        "seconds": round(seconds, 1)}
        print(name, memory[name], flush=True)
    rounds = []
    for r in range(args.rounds):
        pair = {}
        order = (("streaming", streaming), ("whole", whole))
        for name, options in order if r % 2 == 0 else order[::-1]:
            seconds, peak = measured(kt_translate(flags, small, os.path.join(work, "t.out"),
                                                  *options))
            pair[name] = {"sentences_per_second": round(args.lines / seconds, 1),
                          "peak_rss_mib": round(peak)}
        pair["ratio"] = round(pair["streaming"]["sentences_per_second"]
                              / pair["whole"]["sentences_per_second"], 3)
        rounds.append(pair)
        print("round", r, pair, flush=True)
    resume_output = os.path.join(work, "resume.out")
    resume = resume_after_kill(kt_translate(flags, small, resume_output, *streaming),
                               resume_output, args.lines)
    resume["uninterrupted_seconds"] = memory["small"]["seconds"]
    print("resume", resume, flush=True)
    fields = provenance.record()
    document = {**fields, "kind": "corpus", "model": flags, "args": vars(args),
                "memory": memory,
                "memory_growth_mib": memory["large"]["peak_rss_mib"]
                - memory["small"]["peak_rss_mib"],
                "throughput_rounds": rounds,
                "streaming_over_whole_median": statistics.median(r["ratio"] for r in rounds),
                "resume": resume}
    print(f"memory {memory['small']['peak_rss_mib']} MiB at {args.lines} lines, "
          f"{memory['large']['peak_rss_mib']} MiB at {large_lines}; streaming over one "
          f"window: {document['streaming_over_whole_median']:.3f}x")
    provenance.write_result(document, fields, "corpus", args.json)


if __name__ == "__main__":
    main()
