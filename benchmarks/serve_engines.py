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
2. Overhead: the same requests of `--batch` sentences, one after another,
   five ways: CTranslate2 and SentencePiece alone in this process
   (`RawCTranslate2`, the floor), `CTranslate2Translator` in this process,
   kt-serve on the int8 version (no batching), the plainest HTTP server
   around CTranslate2 alone (`serve_plain`: one thread, `http.server`, no
   checks: what any server adds on this machine), and kt-serve's design
   without its application (`serve_bare`: kt-serve's uvicorn and event
   loop, CTranslate2 alone on a worker thread, no checks), each server
   from one client (`http.client`, one keep-alive connection);
   sentences/s of each over `--overhead-rounds` rounds, each request sent
   the five ways in turn (in an order shuffled from request to request).
   The ratios to the floor are the medians of per-round ratios; the
   translations of all are compared. With `--baseline REV`, kt-serve at
   commit REV (its `keras_transformer/`, from `git archive`) is a sixth
   contender, so a change to the server is measured against its parent in
   the same rounds.
3. Load: `--clients` clients send requests of one to four test sentences
   (`--requests` per round) to kt-serve on the SavedModel and to kt-serve on
   the int8 version, both with --enable-batching, alternating rounds:
   sentences/s of each and their ratio.
4. Threads: the int8 engine's single-sentence latency (p50 over
   `--singles` sentences) with intra_threads 1 and 2.

With `--ctranslate2-export DIR` (an export's version directory, such as
`saved_models/multi30k_en_de_ct2/1`, or the directory of its versions: the
newest) parts 2 and 4 time that export instead
of the run's, on the sentences of `--source-file` (one per line; default
the held-out test sentences):

    python -m benchmarks serve-engines --parts overhead \\
        --ctranslate2-export saved_models/multi30k_en_de_ct2/1 \\
        --source-file ../shared/data/multi30k/val.en

CTranslate2 runs with `--ctranslate2-threads` intra threads in every part
but 4. The result goes to
`benchmarks/results/<cpu>_<date>_<commit>_serve-engines.json`.
"""

import concurrent.futures
import http.server
import json
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

from benchmarks import harness, tiny_serving


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


class RawCTranslate2:
    """CTranslate2 and SentencePiece alone on an export directory, the
    least a translation takes: each sentence encoded to pieces, one
    `translate_batch` call per batch (the export's beam size, alpha and
    min_length, under the package's length limit of the batch's longest
    sentence), the best hypotheses decoded. No input rules (blank
    sentences, truncation) and one limit per batch."""

    def __init__(self, model_dir, threads):
        import ctranslate2
        import sentencepiece

        from keras_transformer.export.ctranslate2 import read_ctranslate2_metadata
        from keras_transformer.export.ctranslate2_translator import decoding_limit

        metadata = read_ctranslate2_metadata(model_dir)
        defaults = metadata["defaults"]
        self.processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(model_dir, metadata["source_sentencepiece"]))
        self.target = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(model_dir, metadata["target_sentencepiece"]))
        self.translator = ctranslate2.Translator(model_dir, intra_threads=threads)
        self.options = {"beam_size": defaults["beam_size"],
                        "length_penalty": defaults["alpha"],
                        "min_decoding_length": defaults["min_length"]}
        extra, longest = defaults["extra_length"], metadata["config"]["max_length"]
        self.limit = lambda pieces: decoding_limit(pieces, extra, longest)

    def translate(self, sentences):
        pieces = [self.processor.encode(s, out_type=str) for s in sentences]
        out = self.translator.translate_batch(
            pieces, max_decoding_length=self.limit(max(map(len, pieces))), **self.options)
        return [self.target.decode(result.hypotheses[0]) for result in out]


def serve_plain(model_dir, threads):
    """The least an HTTP server adds: Python's own `http.server`, one
    thread, keep-alive, answering TF Serving's columnar predict request
    (`{"inputs": {"text": [...]}}`) with `RawCTranslate2` called inline, and
    no checks. Prints `PLAIN_READY`'s line once it listens; serves until
    killed."""
    raw = RawCTranslate2(model_dir, int(threads))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive
        disable_nagle_algorithm = True  # headers and body go out at once

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            text = json.loads(body)["inputs"]["text"]
            answer = json.dumps({"outputs": {"translation": raw.translate(text)}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    print(f"plain HTTP server at http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


PLAIN_READY = re.compile(r"plain HTTP server at (?P<url>http://\S+)")


def serve_bare(model_dir, threads):
    """The least a server of kt-serve's design adds: kt-serve's uvicorn
    (`server.run_server`: its protocol, parser and connection limits) and
    asyncio's event loop around an ASGI application that does no routing,
    checks or metrics, with `RawCTranslate2` called on a worker thread, as
    kt-serve calls its engine so that it keeps answering while a model runs.
    Prints `BARE_READY`'s line once it listens; serves until killed."""
    import asyncio

    from keras_transformer.serving import server

    raw = RawCTranslate2(model_dir, int(threads))
    executor = concurrent.futures.ThreadPoolExecutor(1)

    async def app(scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        text = json.loads(body)["inputs"]["text"]
        translations = await asyncio.get_running_loop().run_in_executor(
            executor, raw.translate, text)
        answer = json.dumps({"outputs": {"translation": translations}}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    sock = server.bind("127.0.0.1", 0)
    server.run_server(app, sock, ready=lambda: print(
        f"bare uvicorn server at {server.url_of(sock)}", flush=True))


BARE_READY = re.compile(r"bare uvicorn server at (?P<url>http://\S+)")


def overhead_round(urls, engines, batches, seed=0):
    """Sentences/s of each server of `urls` (`{name: predict URL}`) and of
    each of `engines` (`{name: translate(batch) -> translations}`) over
    `batches`, and the translations of each. Each batch goes through all of
    them, in an order shuffled from batch to batch (seeded with `seed`), so
    a change in the machine's load falls on all alike and none always
    follows the same other one (what ran just before a request, in this
    process or another, changes its time). The client is
    `http.client` on one keep-alive connection per server: the least a
    client can add, so a server's figure against the others is its cost."""
    import http.client
    import urllib.parse

    connections = {}

    def client(url):
        address = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
        connections[url] = connection

        def served(batch):
            connection.request("POST", address.path,
                               json.dumps({"inputs": {"text": batch}}).encode(),
                               {"Content-Type": "application/json"})
            answer = connection.getresponse()
            body = answer.read()
            if answer.status != 200:
                raise RuntimeError(f"{answer.status}: {body[:300]!r}")
            return body

        return served

    calls = {**{name: client(url) for name, url in urls.items()}, **engines}
    names = list(calls)
    seconds = dict.fromkeys(names, 0.0)
    translations = {name: [] for name in names}
    try:
        order = random.Random(seed)
        for batch in batches:
            for name in order.sample(names, len(names)):
                start = time.perf_counter()
                out = calls[name](batch)
                seconds[name] += time.perf_counter() - start
                translations[name].append(out)
    finally:
        for connection in connections.values():
            connection.close()
    for name in urls:
        translations[name] = [json.loads(body)["outputs"]["translation"]
                              for body in translations[name]]
    sentences = sum(map(len, batches))
    return ({name: sentences / seconds[name] for name in names},
            {name: [t for batch in out for t in batch] for name, out in translations.items()})


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
    return statistics.median(harness.seconds_each(lambda s: engine.translate([s]), singles))


def measure_overhead(args, int8_base, int8_dir, sentences):
    """Part 2: CTranslate2 and SentencePiece alone, `CTranslate2Translator`,
    kt-serve on the int8 version, the plainest HTTP server around
    CTranslate2 alone (`serve_plain`), kt-serve's design without its
    application (`serve_bare`) and, with
    `args.baseline`, kt-serve at that commit: each batch every way in turn
    (`overhead_round`)."""
    from keras_transformer.export.ctranslate2_translator import CTranslate2Translator

    serve_argv = ["--model-name", "m", "--model-base-path", int8_base,
                  "--ctranslate2-threads", str(args.ctranslate2_threads)]
    def server_command(function):
        return [sys.executable, "-c", "import sys; from benchmarks.serve_engines import "
                f"{function}; {function}(*sys.argv[1:])", int8_dir,
                str(args.ctranslate2_threads)]
    servers, urls = [], {}
    with tempfile.TemporaryDirectory(prefix="kt-serve-baseline-") as package:
        try:
            process, url = tiny_serving.start_server(serve_argv)
            servers.append(process)
            urls["kt_serve"] = f"{url}/v1/models/m:predict"
            for name, function, ready in (("plain_http", "serve_plain", PLAIN_READY),
                                          ("bare_uvicorn", "serve_bare", BARE_READY)):
                process, match = harness.start_process(server_command(function), ready)
                servers.append(process)
                urls[name] = f"{match.group('url')}/v1/models/m:predict"
            if args.baseline:
                harness.extract_package(args.baseline, package)
                process, url = tiny_serving.start_server(serve_argv,
                                                         env={"PYTHONPATH": package})
                servers.append(process)
                urls["kt_serve_baseline"] = f"{url}/v1/models/m:predict"
            return _overhead_rounds(args, urls, CTranslate2Translator(
                int8_dir, intra_threads=args.ctranslate2_threads),
                RawCTranslate2(int8_dir, args.ctranslate2_threads), sentences)
        finally:
            for server in servers:
                harness.stop_process(server)


def _overhead_rounds(args, urls, translator, raw, sentences):
    engines = {"raw": raw.translate, "translator": lambda batch: translator.translate(batch)[0]}
    rng = random.Random(0)
    batches = [rng.sample(sentences, args.batch) for _ in range(args.batches)]
    names = ["raw", "translator", *urls]
    ratios = [f"{name}_over_raw" for name in names[1:]]
    overhead_round(urls, engines, batches[:3])  # warm them all
    rounds, identical = [], {}
    for r in range(args.overhead_rounds):
        rates, translations = overhead_round(urls, engines, batches, seed=r)
        rounds.append({**rates, **{f"{name}_over_raw": rates[name] / rates["raw"]
                                   for name in names[1:]}})
        for name in names[1:]:
            same = sum(a == b for a, b in zip(translations["raw"], translations[name]))
            identical[name] = min(identical.get(name, same), same)
        print(f"overhead round {r}: " + ", ".join(
            f"{name} {rates[name]:.0f}" for name in names) + " sentences/s", flush=True)
    return {"rounds": rounds, "batch": args.batch, "batches": args.batches,
            "baseline": args.baseline,
            "sentences_per_round": args.batch * args.batches,
            "identical_to_raw": {**identical, "of": args.batch * args.batches},
            **{f"{name}_median": statistics.median(r[name] for r in rounds) for name in names},
            **{f"{ratio}_median": statistics.median(r[ratio] for r in rounds)
               for ratio in ratios}}


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
        for r, order in harness.flipped(servers, args.rounds):
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
    parser = harness.parser(__doc__)
    parser.add_argument("--run-dir", default="runs/demo")
    parser.add_argument("--checkpoint", default="auto")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--overhead-rounds", type=int, default=12)
    parser.add_argument("--singles", type=int, default=40)
    parser.add_argument("--ctranslate2-threads", type=int, default=1)
    parser.add_argument("--baseline", metavar="REV",
                        help="also time kt-serve at this commit in the overhead part")
    parser.add_argument("--parts", default="match,overhead,load,threads",
                        help="which of the four parts to run (comma-separated)")
    parser.add_argument("--ctranslate2-export", metavar="DIR",
                        help="time this CTranslate2 export (a version directory, or the "
                             "directory of versions: the newest) instead of the run's int8 "
                             "one; parts overhead and threads only")
    parser.add_argument("--source-file", metavar="FILE",
                        help="the sentences to translate, one per line (default: the "
                             "built-in corpus's held-out test sentences)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    parts = harness.parts(parser, args.parts, ["match", "overhead", "load", "threads"],
                          "--parts")
    if args.ctranslate2_export and parts - {"overhead", "threads"}:
        parser.error("--ctranslate2-export times an export alone: --parts overhead,threads "
                     f"at most, not {','.join(sorted(parts - {'overhead', 'threads'}))}")
    from keras_transformer.export.ctranslate2 import (
        read_ctranslate2_metadata,
        resolve_ctranslate2_dir,
    )
    from keras_transformer.export.ctranslate2_translator import CTranslate2Translator

    export_defaults = None
    if args.ctranslate2_export:
        try:
            export_defaults = read_ctranslate2_metadata(args.ctranslate2_export)["defaults"]
        except FileNotFoundError as e:
            parser.error(f"--ctranslate2-export: {e}")

    record = harness.record()
    report = {**record, "run_dir": args.run_dir, "args": vars(args)}
    if args.source_file:
        sentences = [line for line in harness.read_text(args.source_file)
                     if line.strip()][:args.sentences]
    else:
        sentences = harness.held_out(args.sentences)[0]
    with tempfile.TemporaryDirectory() as work_dir:
        if args.ctranslate2_export:
            engines = {"int8": resolve_ctranslate2_dir(args.ctranslate2_export)}
            report["defaults"] = export_defaults
        else:
            saved_model, engines, translator = export_all(args.run_dir, args.checkpoint,
                                                          work_dir)
            report["defaults"] = {"beam_size": translator.beam_size, "alpha": translator.alpha,
                                  "extra_length": translator.extra_length}
        defaults = report["defaults"]
        int8_base = os.path.dirname(os.path.abspath(engines["int8"]))
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
    harness.write_result(report, record, "serve-engines", args.json, indent=1)
    if "overhead" in report:
        overhead = report["overhead"]
        print(f"overhead: against CTranslate2 and SentencePiece alone, sentences/s: "
              f"CTranslate2Translator {overhead['translator_over_raw_median']:.3f}, "
              f"kt-serve {overhead['kt_serve_over_raw_median']:.3f}, the plainest HTTP "
              f"server {overhead['plain_http_over_raw_median']:.3f}, kt-serve's design "
              f"without its application {overhead['bare_uvicorn_over_raw_median']:.3f}"
              + (f", kt-serve at {args.baseline} "
                 f"{overhead['kt_serve_baseline_over_raw_median']:.3f}"
                 if args.baseline else ""))
    if "load" in report:
        print(f"load: kt-serve on CTranslate2 int8 / on the SavedModel, sentences/s: "
              f"{report['load']['ratio_median']:.3f}")
