"""The requests of `serve_load`: the mix of valid and faulty requests with
the answer each must get, sending them from concurrent clients, checking
every answer, and the figures of a run.

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
"""

import base64
import dataclasses
import itertools
import json
import random
import threading
import time

import numpy as np

# Relative tolerance of scores: float32 rounding of a sum of a few dozen log
# probabilities computed in another batch composition; absolute for scores
# near zero.
SCORE_RTOL = 1e-5
SCORE_ATOL = 1e-6
OPTIONS = {"beam_size": 2, "alpha": 0.6, "extra_length": 3}
INVALID_UTF8 = b"caf\xc3 \xff\xfe ok"
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


def b64(value):
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return base64.b64encode(raw).decode("ascii")


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


def json_bytes(obj):
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def predict_path(name, version=None):
    return f"/v1/models/{name}" + (f"/versions/{version}" if version else "") + ":predict"


def make_spec(kind, versions, rng, pinned=1, max_request_bytes=1 << 16):
    """A request of `kind` (a key of `WEIGHTS`); sentences drawn with `rng`;
    "pinned" requests go to version `pinned`."""
    name, latest = versions.name, predict_path(versions.name)
    texts = versions.texts

    def text(key):
        value = texts[key]
        return {"b64": b64(value)} if isinstance(value, bytes) else value

    def valid(keys, path=latest, signature="serving_default", version=None, extra=None,
              with_signature=True):
        body = {"inputs": {"text": [text(k) for k in keys], **(extra or {})}}
        if with_signature or signature != "serving_default":
            body["signature_name"] = signature
        return Spec(kind, path, json_bytes(body), STATUS[kind], tuple((signature, k) for k in keys),
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
                     path=predict_path(name, pinned), version=pinned)
    if kind == "options":
        return valid([one], signature="translate_with_options", extra=OPTIONS)
    if kind in ("empty", "long"):
        return valid([kind])
    if kind == "b64-invalid-utf8":
        return valid(["invalid"])
    if kind == "raw-invalid-utf8":
        return error(b'{"inputs": {"text": ["' + INVALID_UTF8 + b'"]}}')
    if kind == "malformed-json":
        return error(json_bytes({"inputs": {"text": [texts[one]]}})[:-2])
    if kind == "wrong-field":
        return error(json_bytes({"input": {"text": [texts[one]]}}))
    if kind == "text-number":
        return error(json_bytes({"inputs": {"text": [42]}}))
    if kind == "beam-size-string":
        return error(json_bytes({"signature_name": "translate_with_options",
                            "inputs": {"text": [texts[one]], **OPTIONS, "beam_size": "two"}}))
    if kind == "unknown-model":
        return error(json_bytes({"inputs": {"text": [texts[one]]}}),
                     path=predict_path(name + "-unknown"))
    if kind == "unknown-version":
        return error(json_bytes({"inputs": {"text": [texts[one]]}}), path=predict_path(name, 99))
    if kind in ("too-large", "too-large-chunked"):
        padding = "x" * (max_request_bytes + 1024)
        return error(json_bytes({"inputs": {"text": [padding]}}),
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
                                 body=json_bytes({"inputs": {"text": [versions.texts[k]]}}),
                                 keys=(("serving_default", k),))
             for k in versions.sentences]
    return specs + [make_spec(k, versions, rng, pinned, max_request_bytes)
                    for k in WEIGHTS if k != "sentence"]


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


def close_enough(a, b):
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
    return all(t == answers[k][0] and isinstance(s, (int, float)) and close_enough(s, answers[k][1])
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
                if t == translation and close_enough(score, s)]
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


def _percentile(values, q):
    """The `q` quantile of `values`, interpolated linearly (None if empty)."""
    return float(np.quantile(values, q)) if values else None


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
