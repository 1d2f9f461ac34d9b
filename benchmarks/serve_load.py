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

The requests, their expected answers and the checks are
`benchmarks/serve_requests.py`'s.

Used as a library by tests/test_serve_load.py: `export_versions`,
`serve_version`, `stage_version`, `Server`, `scenario`, `MEMORY_BOUND`.
"""

import argparse
import base64
import dataclasses
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
from benchmarks.serve_requests import (
    INVALID_UTF8,
    OPTIONS,
    VALID,
    WEIGHTS,
    Spec,
    b64,
    candidate_sentences,
    check,
    close_enough,
    figures,
    json_bytes,
    long_text,
    mix,
    predict_path,
    run_load,
    version_of,
    version_states,
    warm_up_specs,
)

ROOT = provenance.ROOT
NAME = "tiny"
SEEDS = {1: 20261126, 2: 20261127}
# The server's resident memory after a run may exceed its memory after the
# warm-up by this fraction of it or by this many MiB, whichever is larger:
# a swap holds two loaded versions at once and kt-serve's malloc settings
# keep the heap's peak, so the bound is one more loaded version with a
# margin (docs/serving.md has the figures it rests on).
MEMORY_BOUND = {"fraction": 0.5, "mib": 512}
BATCHING_FLAGS = ["--enable-batching", "--max-batch-size", "32", "--batch-timeout-micros",
                  "2000", "--max-enqueued-batches", "64", "--num-batch-threads", "1"]


# ---------------------------------------------------------------------------
# Models and expected answers


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

    encoded = [b64(texts[k]) for k in keys]
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
        return a[0] != b[0] or not close_enough(a[1], b[1])

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


# ---------------------------------------------------------------------------
# Running


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


# ---------------------------------------------------------------------------
# Figures


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
        for path, version in ((predict_path(versions.name), None),
                              (predict_path(versions.name, 2), 2)):
            after_specs.append(Spec("sentence" if version is None else "pinned", path,
                                    json_bytes({"inputs": {"text": [versions.texts[key]]}}),
                                    200,
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
