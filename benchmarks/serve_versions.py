"""The two tiny versions `serve_load` serves: exported from two seeds
(benchmarks/tiny_serving.py's `export_tiny_model`), every expected answer
of both computed by calling each SavedModel in a process of its own, then
published and staged as kt-serve finds versions.
"""

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import harness, tiny_serving
from benchmarks.serve_requests import (
    INVALID_UTF8,
    OPTIONS,
    b64,
    candidate_sentences,
    close_enough,
    long_text,
)

NAME = "tiny"
SEEDS = {1: 20261126, 2: 20261127}


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


def _run_jobs(request, emit, export=None):
    """Does `request`'s jobs in order, each
    `{"version", "seed", "directory", "name"}` (export a tiny model) or
    `{"version", "seed", "from", "target"}` (a `_reweighted_copy` of an
    exported version), and calls `emit` with `{"event": "exported",
    "version", "path"}` once a version directory is complete; then with
    `{"event": "answers", "answers": {version: ...}}`: the answers of each
    version's `serving_default` and `translate_with_options` signatures to
    the request's texts (base64; each list in one call). `export`: what
    exports a tiny model (`tiny_serving.export_tiny_model`'s signature;
    None: that function)."""
    export_tiny_model = export or tiny_serving.export_tiny_model
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
    # Named from the function itself, so that moving it cannot break the workers.
    code = f"from {_export_worker.__module__} import _export_worker; _export_worker()"
    workers = []
    for jobs in groups:
        log = tempfile.TemporaryFile()
        process = subprocess.Popen([sys.executable, "-c", code], cwd=harness.ROOT, env=env,
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
                    in_process=False, on_exported=None, timeout=900, export=None):
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
    directory is complete. `export`: with `in_process`, what exports a
    version (`tiny_serving.export_tiny_model`'s signature; None: that
    function), e.g. a test's cache of exports.

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
            _run_jobs({"jobs": jobs, "texts": encoded}, received, export)
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
