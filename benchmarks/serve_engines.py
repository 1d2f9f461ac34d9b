"""kt-serve's two engines on the same trained weights: do they agree, what
does the server cost over CTranslate2 alone, and which serves more.

    python -m benchmarks serve-engines --run-dir runs/demo

The run's weights (`--checkpoint`, default auto) are exported three times:
as a SavedModel and as CTranslate2 float32 and int8 versions, with the
run's search defaults. Then:

1. Match (in this process): the built-in corpus's held-out test sentences
   (`--sentences`) through the SavedModel (`translate_with_options`) and the
   CTranslate2 float32 engine (kt-serve's `CTranslate2Servable`): the
   fraction of identical best translations at the export's defaults and at
   alpha 0 (where the two length penalties agree), and the largest score
   difference at alpha 0 among identical ones.
2. Server overhead: one client (`http.client`, one keep-alive connection)
   sends the same requests of `--batch` sentences in sequence to kt-serve
   on the int8 version (no batching), and
   the same batches go through `CTranslate2Translator` in this process (no
   server): requests/s of each, in alternating rounds; the ratio is the
   median of per-round ratios.
3. Load: `--clients` clients send requests of one to four test sentences
   (`--requests` per round) to kt-serve on the SavedModel and to kt-serve on
   the int8 version, both with --enable-batching, alternating rounds:
   sentences/s of each and their ratio.
4. Threads: the int8 engine's single-sentence latency (p50 over
   `--singles` sentences) with intra_threads 1 and 2.

CTranslate2 runs with `--ctranslate2-threads` intra threads in every part
but 4. The result goes to
`benchmarks/results/<cpu>_<date>_<commit>_serve-engines.json`.
"""

import argparse
import concurrent.futures
import json
import os
import random
import statistics
import tempfile
import threading
import time

import numpy as np

from benchmarks import provenance, tiny_serving


def export_all(run_dir, checkpoint, work_dir):
    """`(saved model version dir, {quantization: CTranslate2 version dir})`."""
    from keras_transformer.export import export_translator, translator_from_run_directory
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.run_directory import RunDirectory

    run = RunDirectory(run_dir)
    prefix, _ = run.resolve_checkpoint(checkpoint)
    translator = translator_from_run_directory(run, prefix)
    saved_model = export_translator(translator, os.path.join(work_dir, "sm"), name="m",
                                    version=1)
    model = run.load_model(prefix, quiet=True)
    source, target = run.load_tokenizers()
    engines = {q: export_ctranslate2(model, source, target,
                                     os.path.join(work_dir, f"ct2_{q}", "m", "1"),
                                     quantization=q, beam_size=translator.beam_size,
                                     alpha=translator.alpha,
                                     extra_length=translator.extra_length)
               for q in ("float32", "int8")}
    return saved_model, engines, translator


def test_sentences(count):
    from keras_transformer.data.synthetic import generate_corpus

    return generate_corpus()["test"][0][:count]


def match(saved_model, ct2_dir, sentences, defaults, threads):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from keras_transformer.serving.ctranslate2_servable import CTranslate2Servable

    signature = tf.saved_model.load(saved_model).signatures["translate_with_options"]
    servable = CTranslate2Servable(ct2_dir, 1, intra_threads=threads)
    text = np.array([s.encode() for s in sentences], object)
    out = {}
    for label, alpha in (("defaults", defaults["alpha"]), ("alpha_0", 0.0)):
        options = {"beam_size": np.int32(defaults["beam_size"]), "alpha": np.float32(alpha),
                   "extra_length": np.int32(defaults["extra_length"])}
        ours = signature(text=tf.constant(text), **{k: tf.constant(v)
                                                    for k, v in options.items()})
        theirs = servable.predict("translate_with_options", {"text": text, **options})
        same = ours["translation"].numpy() == theirs["translation"]
        differences = np.abs(ours["score"].numpy() - theirs["score"])[same]
        out[label] = {"identical_best": float(np.mean(same)), "sentences": len(sentences),
                      "max_score_difference": float(differences.max(initial=0.0))}
    return out


def _post(session, url, sentences):
    response = session.post(url, json={"inputs": {"text": sentences}}, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text[:300]}")
    return response.json()


def overhead_round(url, engine, batches, server_first=True):
    """`(kt-serve requests/s, CTranslate2 alone requests/s)` over
    `batches`. The client is `http.client` on one keep-alive connection:
    the least a client can add, so the ratio is the server's cost."""
    import http.client
    import urllib.parse

    address = urllib.parse.urlsplit(url)

    def served():
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
        try:
            start = time.perf_counter()
            for batch in batches:
                connection.request("POST", address.path,
                                   json.dumps({"inputs": {"text": batch}}).encode(),
                                   {"Content-Type": "application/json"})
                answer = connection.getresponse()
                body = answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"{answer.status}: {body[:300]!r}")
            return len(batches) / (time.perf_counter() - start)
        finally:
            connection.close()

    def alone():
        start = time.perf_counter()
        for batch in batches:
            engine.translate(batch)
        return len(batches) / (time.perf_counter() - start)

    if server_first:
        first = served()
        return first, alone()
    second = alone()
    return served(), second


def load_round(url, sentences, clients, requests_count, seed):
    """Sentences/s of `requests_count` requests of 1-4 sentences from
    `clients` threads."""
    import requests

    rng = random.Random(seed)
    work = [rng.sample(sentences, rng.randint(1, 4)) for _ in range(requests_count)]
    lock = threading.Lock()
    position = [0]

    def client():
        with requests.Session() as session:
            while True:
                with lock:
                    if position[0] >= len(work):
                        return
                    batch = work[position[0]]
                    position[0] += 1
                _post(session, url, batch)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    return sum(len(w) for w in work) / (time.perf_counter() - start)


def latency(engine, singles):
    times = []
    for sentence in singles:
        start = time.perf_counter()
        engine.translate([sentence])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_overhead(args, int8_base, int8_dir, sentences):
    """Part 2: kt-serve on the int8 version against `CTranslate2Translator`
    in this process, the same batches, alternating rounds."""
    from keras_transformer.export.ctranslate2 import CTranslate2Translator

    plain, url = tiny_serving.start_server([
        "--model-name", "m", "--model-base-path", int8_base, "--ctranslate2-threads",
        str(args.ctranslate2_threads)])
    engine = CTranslate2Translator(int8_dir, intra_threads=args.ctranslate2_threads)
    rng = random.Random(0)
    batches = [rng.sample(sentences, args.batch) for _ in range(args.batches)]
    predict = f"{url}/v1/models/m:predict"
    overhead_round(predict, engine, batches[:3])  # warm both
    rounds = []
    try:
        for r in range(args.rounds):
            served, alone = overhead_round(predict, engine, batches, server_first=r % 2 == 0)
            rounds.append({"kt_serve": served, "ctranslate2_alone": alone,
                           "ratio": served / alone})
            print(f"overhead round {r}: kt-serve {served:.1f} requests/s, CTranslate2 "
                  f"alone {alone:.1f} requests/s", flush=True)
    finally:
        tiny_serving.stop_server(plain)
    return {"rounds": rounds, "batch": args.batch,
            "ratio_median": statistics.median(o["ratio"] for o in rounds)}


def measure_load(args, saved_model, int8_base, sentences):
    """Part 3: kt-serve on the SavedModel and on the int8 version, both
    batching, under `args.clients` clients, alternating rounds."""
    batching = ["--enable-batching", "--max-batch-size", "32", "--ctranslate2-threads",
                str(args.ctranslate2_threads)]
    servers = {}
    try:
        servers["savedmodel"] = tiny_serving.start_server(
            ["--model-name", "m", "--model-base-path", os.path.dirname(saved_model),
             *batching])
        servers["ctranslate2_int8"] = tiny_serving.start_server(
            ["--model-name", "m", "--model-base-path", int8_base, *batching])
        for _, url in servers.values():
            load_round(f"{url}/v1/models/m:predict", sentences, args.clients, 50, 0)
        rounds = []
        for r in range(args.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(list(servers)))
            this = {name: load_round(f"{servers[name][1]}/v1/models/m:predict",
                                     sentences, args.clients, args.requests, r)
                    for name in order}
            rounds.append(this)
            print(f"load round {r}: " + ", ".join(f"{k} {v:.1f} sentences/s"
                                                  for k, v in this.items()), flush=True)
    finally:
        for process, _ in servers.values():
            tiny_serving.stop_server(process)
    return {"rounds": rounds, "clients": args.clients,
            "ratio_median": statistics.median(
                r["ctranslate2_int8"] / r["savedmodel"] for r in rounds)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="runs/demo")
    parser.add_argument("--checkpoint", default="auto")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--singles", type=int, default=40)
    parser.add_argument("--ctranslate2-threads", type=int, default=1)
    parser.add_argument("--parts", default="match,overhead,load,threads",
                        help="which of the four parts to run (comma-separated)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts or parts - {"match", "overhead", "load", "threads"}:
        parser.error(f"--parts takes match, overhead, load, threads; received {args.parts!r}")
    from keras_transformer.export.ctranslate2 import CTranslate2Translator

    record = provenance.record()
    report = {**record, "run_dir": args.run_dir, "args": vars(args)}
    with tempfile.TemporaryDirectory() as work_dir:
        saved_model, engines, translator = export_all(args.run_dir, args.checkpoint, work_dir)
        report["defaults"] = defaults = {"beam_size": translator.beam_size,
                                         "alpha": translator.alpha,
                                         "extra_length": translator.extra_length}
        sentences = test_sentences(args.sentences)
        int8_base = os.path.dirname(engines["int8"])
        if "match" in parts:
            report["match"] = match(saved_model, engines["float32"], sentences, defaults,
                                    args.ctranslate2_threads)
            print("match:", json.dumps(report["match"]), flush=True)
        if "overhead" in parts:
            report["overhead"] = measure_overhead(args, int8_base, engines["int8"], sentences)
        if "load" in parts:
            report["load"] = measure_load(args, saved_model, int8_base, sentences)
        if "threads" in parts:
            singles = sentences[:args.singles]
            report["threads"] = {}
            for intra in (1, 2):
                single = CTranslate2Translator(engines["int8"], intra_threads=intra)
                latency(single, singles[:5])
                report["threads"][f"intra_{intra}_p50_ms"] = 1000 * latency(single, singles)
            print("threads:", json.dumps(report["threads"]), flush=True)
    path = args.json or provenance.result_path(record, "serve-engines")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    for part, what in (("overhead", "kt-serve / CTranslate2 alone, requests/s"),
                       ("load", "kt-serve on CTranslate2 int8 / on the SavedModel, "
                                "sentences/s")):
        if part in report:
            print(f"{part}: {what}: {report[part]['ratio_median']:.3f}")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
