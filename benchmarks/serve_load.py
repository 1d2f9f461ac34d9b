"""kt-serve under concurrent load with faults mixed in: every answer checked,
a new version published mid-run, throughput, latency and the server's
resident memory.

    python -m benchmarks serve-load --clients 16 --requests 2000

exports two tiny random translators (benchmarks/tiny_serving.py's
`export_tiny_model`, two seeds: versions 1 and 2), computes every expected
answer of both by calling each SavedModel in a process of its own, and starts
kt-serve twice on loopback: with `--enable-batching` and without. Each server
first gets a warm-up (every distinct input once), then a publication round
(at least `--publish-requests`; version 2 is published a third of the way
in, and the round goes on until a third more were sent after the status
showed it AVAILABLE), then `--requests` requests in `--rounds` timed rounds
(pinned requests to version 2), the two servers alternating (the order flips
every round) so that the drift of a shared machine falls on both. The
figures (requests/s, p50 and p99 latency of the valid requests, sentences
per model call with batching, RSS after warm-up, after the publication round
and after the timed rounds) go to
`benchmarks/results/<cpu>_<date>_<commit>_serve-load.json` (`--json` names
another file).

The mix (`mix`): valid requests (one to four distinct short sentences, to the
latest version or pinned to one, `serving_default` or `translate_with_options`,
the empty sentence, a sentence ten times the model's source limit, invalid
UTF-8 sent as `{"b64": ...}`), each with its expected 200 answer, and faulty
ones, each with its expected 4xx: raw invalid UTF-8 in the JSON body (400),
malformed JSON (400), "input" for "inputs" (400), text as a number (400),
beam_size as a string (400), an unknown model (404), an unknown version
(404), a body over `--max-request-bytes` with a Content-Length and chunked
(413). `check` holds every answer to its request's expectation: a 200 with
exactly the expected translations and scores within float32 rounding of the
expected ones (of the version that can have served it), a 4xx with a JSON
body `{"error": <non-empty string>}`; no 5xx.

Used as a library by tests/test_serve_load.py: `export_versions`,
`serve_version`, `stage_version`, `Server`, `scenario`, `check`, `STATUS`,
`MEMORY_BOUND`.
"""

import argparse
import base64
import dataclasses
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import provenance, tiny_serving

ROOT = provenance.ROOT
NAME = "tiny"
SEEDS = {1: 20261126, 2: 20261127}
# Relative tolerance of scores: float32 rounding of a sum of a few dozen log
# probabilities computed in another batch composition; absolute for scores
# near zero.
SCORE_RTOL = 1e-5
SCORE_ATOL = 1e-6
OPTIONS = {"beam_size": 2, "alpha": 0.6, "extra_length": 3}
INVALID_UTF8 = b"caf\xc3 \xff\xfe ok"
# The server's resident memory after a run may exceed its memory after the
# warm-up by this fraction of it or by this many MiB, whichever is larger:
# a swap holds two loaded versions at once and kt-serve's malloc settings
# keep the heap's peak, so the bound is one more loaded version with a
# margin (docs/serving.md has the figures it rests on).
MEMORY_BOUND = {"fraction": 0.5, "mib": 512}
BATCHING_FLAGS = ["--enable-batching", "--max-batch-size", "32", "--batch-timeout-micros",
                  "2000", "--max-enqueued-batches", "64", "--num-batch-threads", "1"]
# Kinds of request -> weight in the mix. The 200 kinds carry expected answers.
WEIGHTS = {
    "sentence": 36, "sentences": 10, "pinned": 8, "options": 6,
    "empty": 3, "long": 3, "b64-invalid-utf8": 3,
    "raw-invalid-utf8": 2, "malformed-json": 2, "wrong-field": 2, "text-number": 2,
    "beam-size-string": 2, "unknown-model": 2, "unknown-version": 2,
    "too-large": 2, "too-large-chunked": 1,
}
VALID = {"sentence", "sentences", "pinned", "options", "empty", "long", "b64-invalid-utf8"}
# Kinds of request -> the HTTP status each must get (TF Serving's).
STATUS = {**{kind: 200 for kind in VALID},
          **{kind: 400 for kind in ("raw-invalid-utf8", "malformed-json", "wrong-field",
                                    "text-number", "beam-size-string")},
          "unknown-model": 404, "unknown-version": 404,
          "too-large": 413, "too-large-chunked": 413}


def candidate_sentences():
    """48 distinct short German sentences."""
    subjects = ["Ein Mann", "Eine Frau", "Zwei Hunde", "Die Mädchen", "Ein Kind", "Der Junge"]
    verbs = ["fährt über die Brücke", "spielt im Schnee", "überquert die Straße",
             "läuft zum Haus"]
    return [f"{s} {v}{end}" for s in subjects for v in verbs for end in (".", "!")]


def long_text(max_source_tokens):
    """A sentence of about ten times `max_source_tokens` words."""
    words = "Ein Mann fährt mit dem Fahrrad über die Brücke".split()
    return " ".join(itertools.islice(itertools.cycle(words), 10 * max_source_tokens))


# ---------------------------------------------------------------------------
# Models and expected answers


def _b64(value):
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return base64.b64encode(raw).decode("ascii")


def _reweighted_copy(source, target, seed):
    """Writes `target`: the version directory `source` with each float
    variable's values permuted with `seed` (the same graph, assets and
    signatures, other weights, as a retrained model's export would be).
    Written under a temporary name and renamed into place."""
    import numpy as np
    import tensorflow as tf

    tmp = f"{target}.tmp"
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("variables"))
    reader = tf.train.load_checkpoint(os.path.join(source, "variables", "variables"))
    rng = np.random.default_rng(seed)
    names, tensors = [], []
    for key, dtype in sorted(reader.get_variable_to_dtype_map().items()):
        value = reader.get_tensor(key)
        if dtype == tf.float32 and np.size(value) > 1:
            value = rng.permutation(value.reshape(-1)).reshape(value.shape)
        names.append(key)
        tensors.append(tf.constant(value, dtype=dtype))
    os.makedirs(os.path.join(tmp, "variables"))
    tf.raw_ops.SaveV2(prefix=os.path.join(tmp, "variables", "variables"), tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=tensors)
    os.rename(tmp, target)
    return target


def _export_worker():
    """`_run_jobs` in a process of its own (`export_versions`): the request
    from stdin as JSON, the events to stdout as JSON lines."""
    request = json.loads(sys.stdin.read())
    _run_jobs(request, lambda event: print(json.dumps(event), flush=True))


def _run_jobs(request, emit):
    """Does `request`'s jobs in order, each
    `{"version", "seed", "directory", "name"}` (export a tiny model) or
    `{"version", "seed", "from", "target"}` (a `_reweighted_copy` of an
    exported version), and calls `emit` with `{"event": "exported",
    "version", "path"}` once a version directory is complete; then with
    `{"event": "answers", "answers": {version: ...}}`: the answers of each
    version's `serving_default` and `translate_with_options` signatures to
    the request's texts (base64; each list in one call)."""
    export_tiny_model = tiny_serving.export_tiny_model
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    from keras_transformer.export.saved_model import read_metadata

    paths = {}
    for job in request["jobs"]:
        if "from" in job:
            path = _reweighted_copy(paths[job["from"]], job["target"], job["seed"])
        else:
            path = export_tiny_model(job["directory"], name=job["name"],
                                     version=job["version"], seed=job["seed"])
        paths[job["version"]] = path
        emit({"event": "exported", "version": job["version"], "path": path})
    texts = tf.constant([base64.b64decode(t) for t in request["texts"]])

    def pairs(out):
        return [[t.decode("utf-8"), float(s)]
                for t, s in zip(out["translation"].numpy(), out["score"].numpy())]

    answers = {}
    for version, path in paths.items():
        signatures = tf.saved_model.load(path).signatures
        default = signatures["serving_default"](text=texts)
        options = signatures["translate_with_options"](
            text=texts, beam_size=tf.constant(OPTIONS["beam_size"], tf.int32),
            alpha=tf.constant(OPTIONS["alpha"], tf.float32),
            extra_length=tf.constant(OPTIONS["extra_length"], tf.int32))
        answers[version] = {"path": path, "metadata": read_metadata(path),
                            "serving_default": pairs(default),
                            "translate_with_options": pairs(options)}
    emit({"event": "answers", "answers": answers})


def _run_workers(groups, texts, received, timeout):
    """`_run_jobs` of each group of jobs in a process of its own, all at
    once; `received(event)` for each event as it comes."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    code = "from benchmarks.serve_load import _export_worker; _export_worker()"
    workers = []
    for jobs in groups:
        log = tempfile.TemporaryFile()
        process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=log, text=True)
        process.stdin.write(json.dumps({"jobs": jobs, "texts": texts}))
        process.stdin.close()
        workers.append((process, log))

    def read(process):
        for line in process.stdout:
            if line.startswith("{"):
                received(json.loads(line))

    readers = [threading.Thread(target=read, args=(p,), daemon=True) for p, _ in workers]
    for reader in readers:
        reader.start()
    for (process, log), reader in zip(workers, readers):
        reader.join(timeout)
        process.wait(timeout)
        if process.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"exporting failed (exit status {process.returncode}):\n"
                               f"{log.read().decode(errors='replace')[-3000:]}")
        log.close()


@dataclasses.dataclass
class Versions:
    """Two exported versions of one model and their expected answers.

    `paths[v]`: version v's directory (`<directory>/v<v>/<name>/<v>`).
    `texts[key]`: the input (str, or bytes for invalid UTF-8) of each key:
    the sentences `sentences` (keys "s0", "s1", ...) and "empty", "long",
    "invalid". `answers[v][(signature, key)]`: `(translation, score)` of
    version v to that text.
    """

    name: str
    paths: dict
    texts: dict
    sentences: list
    answers: dict
    max_source_tokens: int


def export_versions(directory, name=NAME, seeds=None, sentences=24, reweight=False,
                    in_process=False, on_exported=None, timeout=900):
    """Versions 1 and 2 of a tiny model (`seeds`: {version: seed}) under
    `directory`, and their answers to the inputs of the mix, computed by
    loading each SavedModel (`tf.saved_model.load(path).signatures`) and
    calling it.

    Without `reweight`, each version is `export_tiny_model` with its seed,
    the two in two processes at once. With `reweight`, version 2 is version
    1's export with its weights permuted (`_reweighted_copy`): seconds
    instead of the tens of seconds an export takes. `in_process`: the
    exports and answers in this process, one after the other (a test
    process, which has TensorFlow imported already); else in processes of
    their own. `on_exported(version, path)` is called as soon as a version's
    directory is complete.

    Keeps the first `sentences` of `candidate_sentences()` whose answers are
    told apart from every other kept sentence's (translation, or score beyond
    the tolerance) in both versions and signatures, and whose two versions'
    answers differ, so that a mixed-up answer or one of the wrong version
    cannot pass.

    Returns: `Versions`. Raises RuntimeError if an export fails or fewer
    than `sentences` sentences are told apart.
    """
    seeds = seeds or SEEDS
    candidates = candidate_sentences()
    # The export's max_source_tokens is known only once it is written: the
    # long text is made from the configured max_length and checked below.
    texts = {f"c{i}": s for i, s in enumerate(candidates)}
    texts.update(empty="", long=long_text(tiny_serving.MAX_LENGTH), invalid=INVALID_UTF8)
    keys = list(texts)

    def export_job(version):
        return {"version": version, "seed": seeds[version], "name": name,
                "directory": os.path.join(str(directory), f"v{version}")}

    if reweight:
        groups = [[export_job(1), {"version": 2, "seed": seeds[2], "from": 1,
                                   "target": os.path.join(str(directory), "v2", name, "2")}]]
        os.makedirs(os.path.join(str(directory), "v2", name))
    else:
        groups = [[export_job(1)], [export_job(2)]]
    events = []
    lock = threading.Lock()

    def received(event):
        with lock:
            events.append(event)
        if event["event"] == "exported" and on_exported is not None:
            on_exported(event["version"], event["path"])

    encoded = [_b64(texts[k]) for k in keys]
    if in_process:
        for jobs in groups:
            _run_jobs({"jobs": jobs, "texts": encoded}, received)
    else:
        _run_workers(groups, encoded, received, timeout)
    results = {int(v): r for e in events if e["event"] == "answers"
               for v, r in e["answers"].items()}
    answers = {v: {(sig, k): tuple(pair) for sig in ("serving_default", "translate_with_options")
                   for k, pair in zip(keys, r[sig])} for v, r in results.items()}
    max_tokens = int(results[1]["metadata"].get("max_source_tokens")
                     or results[1]["metadata"]["config"]["max_length"])
    if len(texts["long"].split()) < 10 * max_tokens:
        raise RuntimeError(f"the long text has fewer than 10 x {max_tokens} words")

    def apart(a, b):
        return a[0] != b[0] or not _close(a[1], b[1])

    signatures = ("serving_default", "translate_with_options")
    kept = []
    for i in range(len(candidates)):
        key = f"c{i}"
        if not all(apart(answers[1][(sig, key)], answers[2][(sig, key)]) for sig in signatures):
            continue
        mine = [answers[v][(sig, key)] for v in answers for sig in signatures]
        if all(apart(a, answers[v][(sig, other)]) for a in mine for other in kept
               for v in answers for sig in signatures):
            kept.append(key)
        if len(kept) == sentences:
            break
    if len(kept) < sentences:
        raise RuntimeError(f"only {len(kept)} of {len(candidates)} sentences have answers "
                           f"told apart; {sentences} needed")
    renamed = {f"s{j}": key for j, key in enumerate(kept)}
    renamed.update(empty="empty", long="long", invalid="invalid")
    return Versions(
        name=name, paths={v: r["path"] for v, r in results.items()},
        texts={new: texts[old] for new, old in renamed.items()},
        sentences=[f"s{j}" for j in range(len(kept))],
        answers={v: {(sig, new): a[(sig, old)] for new, old in renamed.items()
                     for sig in signatures}
                 for v, a in answers.items()},
        max_source_tokens=max_tokens)


def serve_version(path, directory, name=NAME):
    """Copies the version directory `path` to `<directory>/served/<name>/1`.
    Returns the model base path, `<directory>/served/<name>`."""
    base = os.path.join(str(directory), "served", name)
    os.makedirs(base)
    shutil.copytree(path, os.path.join(base, "1"))
    return base


def stage_version(path, directory, base, version=2):
    """Copies the version directory `path` to `<directory>/staged/<version>`
    (beside the served base path, on the same file system).

    Returns: `publish()`, which renames the staged version into `base` in
    one step, as `export_translator` ends an export, and returns the time
    (`time.perf_counter()`) just before the rename.
    """
    staged = os.path.join(str(directory), "staged", str(version))
    shutil.copytree(path, staged)

    def publish():
        started = time.perf_counter()
        os.rename(staged, os.path.join(base, str(version)))
        return started

    return publish


def served_copy(versions, directory):
    """`serve_version` of version 1 and `stage_version` of version 2.
    Returns: `(base_path, publish)`."""
    base = serve_version(versions.paths[1], directory, versions.name)
    return base, stage_version(versions.paths[2], directory, base)


def server_argv(name, base_path, batching, max_request_bytes=1 << 16, poll_seconds=1):
    """kt-serve's arguments (without the port) for this benchmark."""
    return (["--model-name", name, "--model-base-path", str(base_path),
             "--file-system-poll-wait-seconds", str(poll_seconds),
             "--max-request-bytes", str(max_request_bytes)]
            + (BATCHING_FLAGS if batching else []))


@dataclasses.dataclass
class Server:
    """A running kt-serve: its process (`pid` is the kt-serve process
    itself), base URL, model name and request size limit."""

    process: object
    url: str
    name: str
    max_request_bytes: int

    @classmethod
    def start(cls, name, base_path, batching, max_request_bytes=1 << 16, timeout=180):
        process, url = tiny_serving.start_server(
            server_argv(name, base_path, batching, max_request_bytes), timeout=timeout)
        return cls(process, url.rstrip("/"), name, max_request_bytes)

    def stop(self):
        return tiny_serving.stop_server(self.process)

    def rss_mib(self):
        """VmRSS of the kt-serve process (not of its children), MiB."""
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmRSS for process {self.process.pid}")

    def log(self):
        """The server's stderr so far (after `stop`, all of it)."""
        text = getattr(self.process, "stderr_text", None)
        if text is not None:
            return text
        try:
            with open(self.process.stderr_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""


# ---------------------------------------------------------------------------
# Requests


@dataclasses.dataclass(frozen=True)
class Spec:
    """One request: `path` under the server's URL, `body` (bytes; sent
    chunked, without a Content-Length, when `chunked`), the expected HTTP
    status, and for a 200 the answer keys `(signature, text key)` of its
    sentences in order and the version it is pinned to (None: latest)."""

    kind: str
    path: str
    body: bytes
    expect: int
    keys: tuple = ()
    version: int = None
    chunked: bool = False


def _json(obj):
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def _predict(name, version=None):
    return f"/v1/models/{name}" + (f"/versions/{version}" if version else "") + ":predict"


def make_spec(kind, versions, rng, pinned=1, max_request_bytes=1 << 16):
    """A request of `kind` (a key of `WEIGHTS`); sentences drawn with `rng`;
    "pinned" requests go to version `pinned`."""
    name, latest = versions.name, _predict(versions.name)
    texts = versions.texts

    def text(key):
        value = texts[key]
        return {"b64": _b64(value)} if isinstance(value, bytes) else value

    def valid(keys, path=latest, signature="serving_default", version=None, extra=None,
              with_signature=True):
        body = {"inputs": {"text": [text(k) for k in keys], **(extra or {})}}
        if with_signature or signature != "serving_default":
            body["signature_name"] = signature
        return Spec(kind, path, _json(body), STATUS[kind], tuple((signature, k) for k in keys),
                    version)

    def error(body, path=latest, chunked=False):
        return Spec(kind, path, body, STATUS[kind], chunked=chunked)

    one = rng.choice(versions.sentences)
    if kind == "sentence":
        return valid([one], with_signature=rng.random() < 0.5)
    if kind == "sentences":
        return valid(rng.sample(versions.sentences, rng.randint(2, 4)))
    if kind == "pinned":
        return valid(rng.sample(versions.sentences, rng.randint(1, 2)),
                     path=_predict(name, pinned), version=pinned)
    if kind == "options":
        return valid([one], signature="translate_with_options", extra=OPTIONS)
    if kind in ("empty", "long"):
        return valid([kind])
    if kind == "b64-invalid-utf8":
        return valid(["invalid"])
    if kind == "raw-invalid-utf8":
        return error(b'{"inputs": {"text": ["' + INVALID_UTF8 + b'"]}}')
    if kind == "malformed-json":
        return error(_json({"inputs": {"text": [texts[one]]}})[:-2])
    if kind == "wrong-field":
        return error(_json({"input": {"text": [texts[one]]}}))
    if kind == "text-number":
        return error(_json({"inputs": {"text": [42]}}))
    if kind == "beam-size-string":
        return error(_json({"signature_name": "translate_with_options",
                            "inputs": {"text": [texts[one]], **OPTIONS, "beam_size": "two"}}))
    if kind == "unknown-model":
        return error(_json({"inputs": {"text": [texts[one]]}}),
                     path=_predict(name + "-unknown"))
    if kind == "unknown-version":
        return error(_json({"inputs": {"text": [texts[one]]}}), path=_predict(name, 99))
    if kind in ("too-large", "too-large-chunked"):
        padding = "x" * (max_request_bytes + 1024)
        return error(_json({"inputs": {"text": [padding]}}),
                     chunked=kind == "too-large-chunked")
    raise ValueError(f"unknown kind of request {kind!r}; the kinds are {sorted(WEIGHTS)}")


def mix(versions, count, seed=0, pinned=1, max_request_bytes=1 << 16):
    """`count` requests of all kinds, in proportion to `WEIGHTS` (at least
    one of each when `count` allows), shuffled with `seed`."""
    if count < len(WEIGHTS):
        raise ValueError(f"a mix needs at least {len(WEIGHTS)} requests (one of each "
                         f"kind), not {count}")
    total = sum(WEIGHTS.values())
    counts = {k: max(1, round(w * count / total)) for k, w in WEIGHTS.items()}
    counts["sentence"] += count - sum(counts.values())
    rng = random.Random(seed)
    kinds = [k for k, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    return [make_spec(k, versions, rng, pinned, max_request_bytes) for k in kinds]


def warm_up_specs(versions, pinned=1, max_request_bytes=1 << 16):
    """Every distinct valid input once (latest), one of each other kind."""
    rng = random.Random(0)
    specs = [dataclasses.replace(make_spec("sentence", versions, rng),
                                 body=_json({"inputs": {"text": [versions.texts[k]]}}),
                                 keys=(("serving_default", k),))
             for k in versions.sentences]
    return specs + [make_spec(k, versions, rng, pinned, max_request_bytes)
                    for k in WEIGHTS if k != "sentence"]


# ---------------------------------------------------------------------------
# Running


@dataclasses.dataclass
class Outcome:
    """What one request got: times (`time.perf_counter()`) before sending
    and after the answer, HTTP status (None: no answer, see `error`), the
    body parsed as JSON (None if it is not JSON) and its first bytes."""

    spec: Spec
    sent: float
    done: float
    status: int = None
    body: object = None
    text: str = ""
    error: str = None


@dataclasses.dataclass
class Run:
    """A run's outcomes in the order sent, its start and end, when the new
    version was published, when a status request first showed it AVAILABLE
    (answer received; None if not seen), when the last status request was
    sent whose answer showed it not AVAILABLE, status polls that were not
    200, and the server's RSS samples (MiB)."""

    outcomes: list
    start: float
    end: float
    published: float = None
    available_seen: float = None
    unavailable_polled: float = None
    poll_failures: list = dataclasses.field(default_factory=list)
    rss_samples: list = dataclasses.field(default_factory=list)


def _send(session, url, spec, timeout):
    headers = {"Content-Type": "application/json"}
    data = spec.body
    if spec.chunked:
        data = (spec.body[i:i + 8192] for i in range(0, len(spec.body), 8192))
    sent = time.perf_counter()
    try:
        response = session.post(url + spec.path, data=data, headers=headers, timeout=timeout)
    except Exception as error:  # noqa: BLE001  (every failure to get an answer is recorded)
        return Outcome(spec, sent, time.perf_counter(), error=f"{type(error).__name__}: {error}")
    done = time.perf_counter()
    try:
        body = response.json()
    except ValueError:
        body = None
    return Outcome(spec, sent, done, response.status_code, body, response.text[:300])


def version_states(body):
    """`{version: state}` from a model status answer."""
    return {int(s["version"]): s["state"] for s in (body or {}).get("model_version_status", [])}


def run_load(server, specs, clients, publish=None, publish_at=None, new_version=2,
             minimum=None, tail=0, seconds=None, timeout=120):
    """Sends `specs` in order to `server` from `clients` threads (a
    `requests.Session` each), each taking the next unsent request when its
    last one is answered. With `publish`, calls it from a thread of its own
    once request `publish_at` is taken. Meanwhile polls the model's status
    (every 50 ms) and samples the server's RSS.

    With `minimum`, sends at least that many, then stops once `tail` more
    were taken after a status answer showed version `new_version`
    AVAILABLE, or once `seconds` have passed since the start (the rest of
    `specs` is not sent).

    Returns: `Run` (its outcomes: the requests sent, in order).
    """
    import requests

    outcomes = [None] * len(specs)
    counter = itertools.count()
    lock = threading.Lock()
    publish_now = threading.Event()
    finished = threading.Event()
    run = Run(outcomes, time.perf_counter(), None)
    taken = {"count": 0, "when_seen": None}
    deadline = None if seconds is None else run.start + seconds

    def enough(i):
        if minimum is None or i < minimum:
            return False
        if deadline is not None and time.perf_counter() > deadline:
            return True
        return taken["when_seen"] is not None and i >= taken["when_seen"] + tail

    def client():
        with requests.Session() as session:
            while True:
                with lock:
                    i = next(counter)
                    taken["count"] = i + 1
                if i >= len(specs) or enough(i):
                    return
                if publish is not None and i == publish_at:
                    publish_now.set()
                outcomes[i] = _send(session, server.url, specs[i], timeout)

    def publisher():
        while not publish_now.wait(0.05):
            if finished.is_set():
                return
        run.published = publish()

    def poller():
        status_url = f"{server.url}/v1/models/{server.name}"
        with requests.Session() as session:
            while not finished.is_set():
                try:
                    polled = time.perf_counter()
                    response = session.get(status_url, timeout=timeout)
                    got = time.perf_counter()
                    if response.status_code != 200:
                        run.poll_failures.append((response.status_code, response.text[:300]))
                    elif run.available_seen is None:
                        if version_states(response.json()).get(new_version) == "AVAILABLE":
                            run.available_seen = got
                            with lock:
                                taken["when_seen"] = taken["count"]
                        else:
                            run.unavailable_polled = polled
                except Exception as error:  # noqa: BLE001
                    run.poll_failures.append((None, f"{type(error).__name__}: {error}"))
                run.rss_samples.append(server.rss_mib())
                finished.wait(0.05)

    helpers = [threading.Thread(target=poller, daemon=True)]
    if publish is not None:
        helpers.append(threading.Thread(target=publisher, daemon=True))
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in helpers + threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.end = time.perf_counter()
    finished.set()
    for thread in helpers:
        thread.join()
    run.outcomes = [o for o in outcomes if o is not None]
    return run


def wait_for_version(server, version, timeout=120):
    """Polls the model status until `version` is AVAILABLE. Returns the time
    the answer saying so was received; raises TimeoutError with the last
    status."""
    import requests

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        response = requests.get(f"{server.url}/v1/models/{server.name}", timeout=30)
        last = (response.status_code, response.text[:500])
        if response.status_code == 200 and version_states(response.json()).get(version) \
                == "AVAILABLE":
            return time.perf_counter()
        time.sleep(0.1)
    raise TimeoutError(f"version {version} of {server.name} not AVAILABLE after {timeout} s; "
                       f"last status: {last}")


# ---------------------------------------------------------------------------
# Checking


def _close(a, b):
    return abs(a - b) <= SCORE_ATOL + SCORE_RTOL * abs(b)


def _matches(outcome, answers):
    """Whether a 200 body holds exactly `answers[key]` for the spec's keys."""
    outputs = outcome.body.get("outputs") if isinstance(outcome.body, dict) else None
    if not isinstance(outputs, dict):
        return False
    translations, scores = outputs.get("translation"), outputs.get("score")
    keys = outcome.spec.keys
    if not (isinstance(translations, list) and isinstance(scores, list)
            and len(translations) == len(scores) == len(keys)):
        return False
    return all(t == answers[k][0] and isinstance(s, (int, float)) and _close(s, answers[k][1])
               for t, s, k in zip(translations, scores, keys))


def _whose(outcome, versions):
    """What a wrong 200 answer resembles, for the failure message."""
    outputs = outcome.body.get("outputs") if isinstance(outcome.body, dict) else None
    try:
        got = list(zip(outputs["translation"], outputs["score"]))
    except (TypeError, KeyError):
        return f"no outputs: {outcome.text!r}"
    found = []
    for translation, score in got:
        same = [f"v{v} {sig} {key}" for v, table in versions.answers.items()
                for (sig, key), (t, s) in table.items()
                if t == translation and _close(score, s)]
        found.append(same or [f"nothing expected ({translation!r}, {score})"])
    return f"answers resemble {found}"


def check(run, versions, allowed, unloaded=None):
    """Every failure of `run` as a readable line.

    `allowed(outcome)`: the versions whose answer a 200 may be (a set).
    `unloaded`: `(version, after)` of a run with a publication: a request
    pinned to the old `version` may also get 404 (with a JSON error) if its
    answer came after `after`, the time a status request was sent whose
    answer still showed the new version not AVAILABLE (until the new one is
    available the old one must answer).
    """
    failures = []
    for i, o in enumerate(run.outcomes):
        where = f"request {i} ({o.spec.kind}, {o.spec.path})"
        if o.status is None:
            failures.append(f"{where}: no answer: {o.error}")
            continue
        if o.status >= 500:
            failures.append(f"{where}: {o.status} {o.text!r}")
            continue
        if o.spec.expect == 200:
            if (o.status == 404 and unloaded is not None and o.spec.version == unloaded[0]
                    and o.done > unloaded[1] and _error_body(o)):
                continue
            if o.status != 200:
                failures.append(f"{where}: {o.status} {o.text!r}, expected 200")
                continue
            ok = allowed(o)
            if not any(_matches(o, versions.answers[v]) for v in ok):
                failures.append(f"{where}: not the answer of version(s) {sorted(ok)}: "
                                f"{_whose(o, versions)}")
        else:
            if o.status != o.spec.expect:
                failures.append(f"{where}: {o.status} {o.text!r}, expected {o.spec.expect}")
            elif not _error_body(o):
                failures.append(f"{where}: {o.status} without a JSON {{\"error\": "
                                f"<non-empty string>}} body: {o.text!r}")
    for status, text in run.poll_failures:
        failures.append(f"status request: {status} {text!r}")
    return failures


def _error_body(outcome):
    body = outcome.body
    return (isinstance(body, dict) and isinstance(body.get("error"), str)
            and body["error"].strip() != "")


def version_of(outcome, versions):
    """The versions whose answer a 200 outcome matches."""
    return {v for v in versions.answers if _matches(outcome, versions.answers[v])}


# ---------------------------------------------------------------------------
# Figures


def _percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def figures(runs):
    """Throughput and latency of `runs` pooled: requests/s over the runs'
    summed wall time, p50 and p99 latency (ms) of valid requests that got
    200, and the counts of statuses by kind."""
    outcomes = [o for r in runs for o in r.outcomes]
    seconds = sum(r.end - r.start for r in runs)
    latencies = [1000 * (o.done - o.sent) for o in outcomes
                 if o.spec.kind in VALID and o.status == 200]
    sentences = sum(len(o.spec.keys) for o in outcomes
                    if o.spec.kind in VALID and o.status == 200)
    statuses = {}
    for o in outcomes:
        kind = statuses.setdefault(o.spec.kind, {})
        kind[str(o.status)] = kind.get(str(o.status), 0) + 1
    return {
        "requests": len(outcomes), "seconds": seconds,
        "requests_per_s": len(outcomes) / seconds if seconds else None,
        "valid_requests": len(latencies),
        "valid_sentences_per_s": sentences / seconds if seconds else None,
        "latency_ms_p50": _percentile(latencies, 0.5),
        "latency_ms_p99": _percentile(latencies, 0.99),
        "server_errors_5xx": sum(1 for o in outcomes if o.status is not None
                                 and o.status >= 500),
        "no_answer": sum(1 for o in outcomes if o.status is None),
        "statuses_by_kind": statuses,
    }


def batching_statistics(server):
    """The server's batching counters (`GET /v1/models/NAME/batching`)."""
    import requests

    response = requests.get(f"{server.url}/v1/models/{server.name}/batching", timeout=30)
    response.raise_for_status()
    return response.json()


def batches_between(before, after):
    """Batches, requests and rows run between two `batching_statistics`,
    and the mean rows (sentences) and requests per batch."""
    if not (before.get("enabled") and after.get("enabled")):
        return None
    counts = {k: after[k] - before[k] for k in ("batches", "requests", "rows")}
    batches = counts["batches"] or 1
    return {**counts, "rows_per_batch": counts["rows"] / batches,
            "requests_per_batch": counts["requests"] / batches}


def memory_limit(warm_mib):
    """The most RSS (MiB) a run may leave after `warm_mib` after warm-up."""
    return warm_mib + max(MEMORY_BOUND["fraction"] * warm_mib, MEMORY_BOUND["mib"])


# ---------------------------------------------------------------------------
# A scenario: warm-up, a run with a publication, the new version afterwards


def warm_up(server, versions, clients, pinned=1):
    """Sends `warm_up_specs` and checks them. Returns `(run, failures)`."""
    run = run_load(server, warm_up_specs(versions, pinned, server.max_request_bytes), clients)
    return run, check(run, versions, lambda o: {o.spec.version or pinned})


def publication_run(server, versions, clients, count, publish, seed=0, fraction=1 / 3,
                    tail=None, wait_timeout=180):
    """At least `count` requests of the mix (pinned ones to version 1), with
    version 2 published after `fraction` of them are taken, going on until
    `tail` (default `count // 3`) more were taken after a status answer
    showed version 2 AVAILABLE (at most `wait_timeout` seconds); then sends
    every sentence once more to the latest version and once pinned to
    version 2.

    Returns: `(run, after, failures, facts)`. `after` is the run after the
    swap. A latest answer may come from either version until a status
    answer showed version 2 AVAILABLE, from version 2 only after; a pinned
    one from its version (or 404 for version 1, once it may have been
    unloaded: see `check`). `facts`: when the swap happened relative to the
    run, how many latest answers each version gave.
    """
    tail = count // 3 if tail is None else tail
    # Enough requests for the swap to fall inside the run however slowly the
    # new version loads; `wait_timeout` bounds the run.
    specs = mix(versions, 20 * count, seed, pinned=1,
                max_request_bytes=server.max_request_bytes)
    run = run_load(server, specs, clients, publish=publish, publish_at=int(count * fraction),
                   minimum=count, tail=tail, seconds=wait_timeout)
    failures = []
    if run.published is None:
        failures.append("version 2 was never published")
    available = run.available_seen
    if available is None:
        try:
            available = wait_for_version(server, 2, wait_timeout)
        except TimeoutError as error:
            failures.append(str(error))
    seen = available if available is not None else float("inf")

    def allowed(o):
        if o.spec.version is not None:
            return {o.spec.version}
        return {2} if o.sent > seen else {1, 2}

    failures += check(run, versions, allowed,
                      unloaded=(1, run.unavailable_polled or run.start))
    rng = random.Random(seed + 1)
    after_specs = []
    for key in versions.sentences:
        for path, version in ((_predict(versions.name), None), (_predict(versions.name, 2), 2)):
            after_specs.append(Spec("sentence" if version is None else "pinned", path,
                                    _json({"inputs": {"text": [versions.texts[key]]}}), 200,
                                    (("serving_default", key),), version))
    rng.shuffle(after_specs)
    after = run_load(server, after_specs, clients)
    failures += [f"after the swap: {f}" for f in check(after, versions, lambda o: {2})]
    latest = [o for o in run.outcomes if o.status == 200 and o.spec.version is None
              and o.spec.kind in VALID]
    by_version = {1: [], 2: []}
    for o in latest:
        which = version_of(o, versions)
        if len(which) == 1:  # the empty sentence's answers are the same
            by_version[which.pop()].append(o.sent - run.start)
    facts = {
        "published_s": None if run.published is None else run.published - run.start,
        "available_seen_s": None if available is None else available - run.start,
        "run_s": run.end - run.start, "requests": len(run.outcomes),
        "latest_answers_v1": len(by_version[1]), "latest_answers_v2": len(by_version[2]),
        "last_v1_answer_sent_s": max(by_version[1], default=None),
        "first_v2_answer_sent_s": min(by_version[2], default=None),
    }
    return run, after, failures, facts


def scenario(server, versions, publish, clients=16, count=300, seed=0):
    """Warm-up, RSS, a publication run, RSS. Returns a report dict:
    `failures` (empty when every answer was right), `figures` of the
    publication run, `swap` facts, `rss_mib` {"started" (before the
    warm-up), "warm", "after", "peak", "limit"}."""
    rss_started = server.rss_mib()
    warm, failures = warm_up(server, versions, clients)
    time.sleep(0.5)
    rss_warm = server.rss_mib()
    run, after, more, facts = publication_run(server, versions, clients, count, publish, seed)
    failures = [f"warm-up: {f}" for f in failures] + more
    time.sleep(0.5)
    rss_after = server.rss_mib()
    return {"failures": failures, "figures": figures([run]), "swap": facts,
            "rss_mib": {"started": rss_started, "warm": rss_warm, "after": rss_after,
                        "peak": max(run.rss_samples + after.rss_samples + [rss_after]),
                        "limit": memory_limit(rss_warm)}}


def weights_of(version):
    """Which export's weights `swaps_run` publishes as `version`: 2's for
    even versions, 1's for odd ones."""
    return 2 if version % 2 == 0 else 1


def swaps_run(server, versions, directory, base, swaps, clients=16, count=40, seed=0,
              wait_timeout=180):
    """`swaps` publications in a row under load: versions 2, 3, ...,
    `swaps + 1`, each a copy of export 1 or 2 (`weights_of`), published
    after a quarter of at least `count` requests of the mix (pinned ones to
    the version served before it), the run going on until `count // 3` more
    were taken after a status answer showed the new version AVAILABLE.
    Every answer is checked as in `publication_run`.

    Returns: `(failures, rss_mib)`, `rss_mib` the server's resident memory
    after each swap (MiB, in order).
    """
    failures, rss = [], []
    for k in range(swaps):
        new, old = k + 2, k + 1
        publish = stage_version(versions.paths[weights_of(new)],
                                os.path.join(str(directory), f"swap-{new}"), base, new)
        specs = mix(versions, 20 * count, seed + k, pinned=old,
                    max_request_bytes=server.max_request_bytes)
        run = run_load(server, specs, clients, publish=publish, publish_at=count // 4,
                       new_version=new, minimum=count, tail=count // 3, seconds=wait_timeout)
        available = run.available_seen
        if available is None:
            try:
                available = wait_for_version(server, new, wait_timeout)
            except TimeoutError as error:
                failures.append(f"swap to {new}: {error}")
                available = float("inf")

        def allowed(o, old=old, new=new, seen=available):
            if o.spec.version is not None:
                return {weights_of(o.spec.version)}
            return ({weights_of(new)} if o.sent > seen
                    else {weights_of(old), weights_of(new)})

        failures += [f"swap to {new}: {f}" for f in
                     check(run, versions, allowed,
                           unloaded=(old, run.unavailable_polled or run.start))]
        wait_for_version(server, new, wait_timeout)
        time.sleep(0.2)
        rss.append(server.rss_mib())
    return failures, rss


# ---------------------------------------------------------------------------
# The benchmark



def _summary_line(label, f):
    return (f"  {label:30s} {f['requests']:5d} requests in {f['seconds']:6.1f} s: "
            f"{f['requests_per_s']:6.1f} requests/s, {f['valid_sentences_per_s']:6.1f} "
            f"sentences/s; valid p50 {f['latency_ms_p50']:7.1f} ms, "
            f"p99 {f['latency_ms_p99']:7.1f} ms; 5xx {f['server_errors_5xx']}")


def main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=2000,
                        help="timed requests per server, over all rounds")
    parser.add_argument("--rounds", type=int, default=8,
                        help="timed rounds per server, alternating between the servers")
    parser.add_argument("--publish-requests", type=int, default=300,
                        help="requests of the untimed round that publishes version 2")
    parser.add_argument("--modes", default="batching,plain",
                        help="servers to start: batching (--enable-batching), plain")
    parser.add_argument("--max-request-bytes", type=int, default=1 << 16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="the result file (default: benchmarks/results/"
                                       "<cpu>_<date>_<commit>_serve-load.json)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if set(modes) - {"batching", "plain"} or not modes:
        parser.error(f"--modes takes batching and/or plain, not {args.modes!r}")
    if args.rounds < 1 or args.requests // args.rounds < len(WEIGHTS):
        parser.error(f"--requests / --rounds must be at least {len(WEIGHTS)} (one request "
                     "of each kind per round)")
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    record = provenance.record()
    load = {"before": os.getloadavg()}
    report = {**record, "clients": args.clients, "requests": args.requests,
              "rounds": args.rounds, "publish_requests": args.publish_requests,
              "max_request_bytes": args.max_request_bytes,
              "batching_flags": BATCHING_FLAGS, "weights": WEIGHTS, "memory_bound": MEMORY_BOUND}
    servers = {}
    with tempfile.TemporaryDirectory(prefix="serve-load-") as directory:
        started = time.perf_counter()
        versions = export_versions(os.path.join(directory, "exports"))
        print(f"exported versions 1 and 2 and computed their answers in "
              f"{time.perf_counter() - started:.0f} s; {len(versions.sentences)} sentences",
              flush=True)
        failures, results = {}, {}
        try:
            publishers = {}
            for mode in modes:
                base, publishers[mode] = served_copy(versions, os.path.join(directory, mode))
                servers[mode] = Server.start(NAME, base, mode == "batching",
                                             args.max_request_bytes)
                print(f"{mode}: kt-serve at {servers[mode].url}, pid "
                      f"{servers[mode].process.pid}", flush=True)
            for mode, server in servers.items():
                started = server.rss_mib()
                warm, failed = warm_up(server, versions, args.clients)
                failures[mode] = [f"warm-up: {f}" for f in failed]
                time.sleep(0.5)
                results[mode] = {"rss_mib": {"started": started, "warm": server.rss_mib()},
                                 "rounds": []}
            for mode, server in servers.items():
                run, after, failed, facts = publication_run(
                    server, versions, args.clients, args.publish_requests, publishers[mode],
                    args.seed)
                failures[mode] += failed
                time.sleep(0.5)
                results[mode]["publication"] = {"figures": figures([run]), "swap": facts}
                results[mode]["rss_mib"]["after_publication"] = server.rss_mib()
                print(_summary_line(f"{mode} publication round", figures([run])), flush=True)
            per_round = args.requests // args.rounds
            timed = {mode: [] for mode in servers}
            counters = {mode: batching_statistics(server) for mode, server in servers.items()}
            for r in range(args.rounds):
                order = list(servers) if r % 2 == 0 else list(servers)[::-1]
                for mode in order:
                    specs = mix(versions, per_round, args.seed + 100 + r, pinned=2,
                                max_request_bytes=args.max_request_bytes)
                    run = run_load(servers[mode], specs, args.clients)
                    failures[mode] += [f"round {r}: {f}" for f in
                                       check(run, versions, lambda o: {2})]
                    timed[mode].append(run)
                    f = figures([run])
                    results[mode]["rounds"].append(
                        {k: f[k] for k in ("requests", "seconds", "requests_per_s",
                                           "valid_sentences_per_s", "latency_ms_p50",
                                           "latency_ms_p99", "server_errors_5xx")})
                    print(_summary_line(f"{mode} round {r}", f), flush=True)
            for mode, server in servers.items():
                time.sleep(0.5)
                rss = results[mode]["rss_mib"]
                rss["after"] = server.rss_mib()
                rss["peak"] = max([rss["after"]] + [s for run in timed[mode]
                                                    for s in run.rss_samples])
                rss["limit"] = memory_limit(rss["warm"])
                if rss["after"] > rss["limit"]:
                    failures[mode].append(f"RSS {rss['after']:.0f} MiB after the run, over "
                                          f"{rss['limit']:.0f} MiB")
                results[mode]["figures"] = figures(timed[mode])
                results[mode]["batches"] = batches_between(counters[mode],
                                                           batching_statistics(server))
                results[mode]["failures"] = failures[mode][:50]
                results[mode]["failure_count"] = len(failures[mode])
        finally:
            for server in servers.values():
                server.stop()
    load["after"] = os.getloadavg()
    report.update(load_average=load, results=results)
    if "batching" in results and "plain" in results:
        ratios = [b["requests_per_s"] / p["requests_per_s"] for b, p in
                  zip(results["batching"]["rounds"], results["plain"]["rounds"])]
        report["batching_over_plain_requests_per_s"] = {"median": statistics.median(ratios),
                                                        "rounds": ratios}
    print(f"{record['cpu']['model']} ({', '.join(record['cpu']['flags'])}), "
          f"{record['cpu']['cores']} cores; load average before {load['before']}, "
          f"after {load['after']}")
    for mode, result in results.items():
        rss = result["rss_mib"]
        print(_summary_line(f"{mode} (timed rounds)", result["figures"]))
        if result["batches"]:
            print(f"  {'':30s} {result['batches']['rows_per_batch']:.1f} sentences and "
                  f"{result['batches']['requests_per_batch']:.1f} requests per model call")
        print(f"  {'':30s} RSS MiB: warm {rss['warm']:.0f}, after publication "
              f"{rss['after_publication']:.0f}, after {rss['after']:.0f}, peak "
              f"{rss['peak']:.0f}, limit {rss['limit']:.0f}; failures "
              f"{result['failure_count']}")
        for failure in result["failures"][:10]:
            print(f"    {failure}")
    if "batching_over_plain_requests_per_s" in report:
        ratio = report["batching_over_plain_requests_per_s"]
        print(f"batching / plain requests/s: median {ratio['median']:.3f} "
              f"(rounds {', '.join(f'{x:.3f}' for x in ratio['rounds'])})")
    provenance.write_result(report, record, "serve-load", args.json)
    return report
