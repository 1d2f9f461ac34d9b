"""The versions of one model that kt-serve serves, chosen by TF Serving's
version policies: the newest N (default 1), all, or specific versions.

`<base path>/<version>/saved_model.pb` (an integer directory name) is a
version; other names (`.tmp-*`, `latest`, a directory without
saved_model.pb) are ignored. `kt-export` writes a version under a temporary
name and renames it into place, so a version directory that exists is
complete.

`VersionManager.start()` loads the versions its policy wants before the
server listens (for the newest N, falling back to older versions when a
newer one fails). Then a background thread looks at the base path every
`poll_wait_seconds` and moves the served set towards the policy's choice:
it loads a wanted version (`tf.saved_model.load`, then the export's warm-up
requests, `assets.extra/tf_serving_warmup_requests`, or one call of
`serving_default` on a short sentence) while the old ones keep serving,
adds it in one assignment, and only then drops the versions no longer
wanted: requests already running on an old version finish on it, later
ones get the new (TF Serving's availability-preserving policy).

A version that fails to load is retried up to `max_num_load_retries` times,
`load_retry_interval` seconds apart (TF Serving's `--max_num_load_retries`
and `--load_retry_interval_micros`), so a version copied in with `cp -r`
loads once the copy is whole; while it waits its state is LOADING with the
last error, and after the last try END with the error. A version given up
on is tried afresh once its directory changes (a file added, replaced or
removed, or the directory copied in again). The versions served meanwhile
keep serving.

One look at the base path runs at a time (the poller's, or a config
reload's), so the record of failed tries has one writer.
"""

import collections
import ctypes
import ctypes.util
import gc
import logging
import os
import threading
import time

import numpy as np

from keras_transformer.export.engine import SERVING_DEFAULT
from keras_transformer.export.saved_model import versions
from keras_transformer.serving.rest_api import RestError, SignatureSpec, TensorSpec

LOGGER = logging.getLogger("kt-serve")
WARM_UP_SENTENCE = "Hello."


class NoServableVersion(FileNotFoundError):
    """The base path holds no version that loads."""


class ModelError(Exception):
    """The model refused its inputs (TensorFlow's InvalidArgumentError):
    the client's fault, HTTP 400. `args[0]` is TensorFlow's message without
    its graph-node lines."""


class ModelOverloaded(Exception):
    """The request needs more memory than the server can give it
    (TensorFlow's ResourceExhaustedError): HTTP 503, the server lives on."""


def _client_message(message):
    """TensorFlow's error message without the lines naming graph nodes
    ("[[{{node ...}}]]", "Detected at node ...") a client cannot act on."""
    kept = [line for line in message.split("\n")
            if line.strip() and not line.strip().startswith(("[[", "Detected at node"))]
    return " ".join(line.strip() for line in kept) or message


class Servable:
    """One loaded version: its signatures, their specs, and the export's
    `assets.extra` metadata.

    Attributes:
        version: int.
        path: the version directory.
        specs: `{signature name: rest_api.SignatureSpec}`.
        metadata: `assets.extra/translator.json` (`{}` if absent).
        examples: `assets.extra/examples.json` (`[]` if absent).
    """

    def __init__(self, path, version):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

        from keras_transformer.export.saved_model import read_examples, read_metadata

        self.version = version
        self.path = path
        self._tf = tf
        self._loaded = tf.saved_model.load(path)
        self._signatures = dict(self._loaded.signatures)
        self.specs = {name: _signature_spec(fn) for name, fn in self._signatures.items()}
        try:
            self.metadata = read_metadata(path)
        except FileNotFoundError:
            self.metadata = {}
        self.examples = read_examples(path)

    def warm_up(self, request_limits=None):
        """Replays the export's warm-up requests
        (`assets.extra/tf_serving_warmup_requests`, TF Serving's format),
        or else calls `serving_default` once on a short sentence (if it
        takes one `text` input), so the first request does not pay for
        TensorFlow's first-call set-up. A warm-up request the model refuses
        fails the load, as in TF Serving, and so does one over
        `request_limits` (a `work.RequestLimits`, checked before it runs).

        Returns: the number of requests replayed.
        """
        from keras_transformer.export.warmup import WARMUP_FILE, read_warmup_file

        path = os.path.join(self.path, "assets.extra", WARMUP_FILE)
        if os.path.isfile(path):
            requests = read_warmup_file(path)
            for number, (signature, inputs) in enumerate(requests, 1):
                if signature not in self.specs:
                    raise ValueError(f"{path}: a warm-up request names signature "
                                     f"'{signature}', which the model does not have.")
                if request_limits is not None:
                    try:
                        request_limits.check(self, inputs)
                    except RestError as e:
                        raise ValueError(f"{path}: warm-up request {number} of "
                                         f"{len(requests)} is refused: {e.message}") from None
                self.predict(signature, inputs)
            return len(requests)
        spec = self.specs.get(SERVING_DEFAULT)
        if spec is not None and set(spec.inputs) == {"text"}:
            self.predict(SERVING_DEFAULT,
                         {"text": np.array([WARM_UP_SENTENCE.encode()], object)})
            return 1
        return 0

    def predict(self, signature, inputs):
        """Runs `signature` on `inputs` (`{name: np.ndarray}` matching its
        specs). Blocks; thread-safe.

        Returns: `{output name: np.ndarray}`.
        Raises: `ModelError` when the model rejects the inputs,
        `ModelOverloaded` when they need more memory than there is.
        """
        tf = self._tf
        tensors = {name: tf.constant(value, tf_dtype(tf, self.specs[signature].inputs[name]))
                   for name, value in inputs.items()}
        try:
            outputs = self._signatures[signature](**tensors)
        except tf.errors.InvalidArgumentError as e:
            raise ModelError(_client_message(e.message)) from None
        except tf.errors.ResourceExhaustedError:
            raise ModelOverloaded(
                "The request needs more memory than the server has (ResourceExhausted): "
                "send fewer sentences or a smaller beam_size.") from None
        return {name: value.numpy() for name, value in outputs.items()}


def _signature_spec(function):
    """A concrete function's inputs and outputs as a `SignatureSpec`."""
    _, inputs = function.structured_input_signature
    return SignatureSpec(
        {name: _tensor_spec(spec) for name, spec in inputs.items()},
        {name: _tensor_spec(spec) for name, spec in function.structured_outputs.items()})


def _tensor_spec(spec):
    dtype = "string" if spec.dtype.name == "string" else spec.dtype.name
    return TensorSpec(dtype, tuple(spec.shape.as_list()))


def tf_dtype(tf, spec):
    return tf.string if spec.dtype == "string" else tf.as_dtype(spec.dtype)


def load_servable(path, version, make=Servable, request_limits=None):
    """Loads (`make(path, version)`, a SavedModel's `Servable` by default)
    and warms up the version at `path`, its warm-up requests under
    `request_limits` (a `work.RequestLimits`, or None). The servable's
    `load_seconds` and `warmup_seconds` say how long each took."""
    start = time.monotonic()
    servable = make(path, version)
    loaded = time.monotonic()
    servable.warm_up(request_limits)
    servable.load_seconds = loaded - start
    servable.warmup_seconds = time.monotonic() - loaded
    return servable


def directory_stamp(path):
    """What changes when the directory `path` or anything under it is
    added, replaced, rewritten or removed: each entry's relative path,
    inode, size and modification time (None when `path` is absent)."""
    if not os.path.isdir(path):
        return None
    stamp = []
    for root, directories, files in os.walk(path):
        directories.sort()
        for name in [""] + sorted(files) if root == path else sorted(files):
            full = os.path.join(root, name) if name else root
            try:
                info = os.stat(full)
            except OSError:
                continue  # removed while we looked: the next look sees it
            stamp.append((os.path.relpath(full, path), info.st_ino, info.st_size,
                          info.st_mtime_ns))
    return tuple(stamp)


def is_ctranslate2_version(path):
    """Whether the directory `path` is a CTranslate2 export of this package
    (`model.bin` and `keras_transformer.json`, as kt-export --format
    ctranslate2 writes them)."""
    return all(os.path.isfile(os.path.join(path, name))
               for name in ("model.bin", "keras_transformer.json"))


def servable_versions(base_path):
    """The integer version directories under `base_path` (`versions`) that
    hold a SavedModel (saved_model.pb) or a CTranslate2 export (model.bin
    and keras_transformer.json), sorted."""
    def complete(path):
        return (os.path.isfile(os.path.join(path, "saved_model.pb"))
                or is_ctranslate2_version(path))

    return [v for v in versions(base_path) if complete(os.path.join(base_path, str(v)))]


class VersionPolicy(collections.namedtuple("VersionPolicy", ["kind", "versions"])):
    """Which versions to serve (TF Serving's `model_version_policy`):
    `VersionPolicy.latest(n)` the newest n, `VersionPolicy.all()` every
    one, `VersionPolicy.specific([v, ...])` those listed.

    Example:

    >>> VersionPolicy.latest(2).choose([1, 3, 7])
    [3, 7]
    >>> VersionPolicy.specific([1, 5]).choose([1, 3, 7])
    [1]
    """

    @classmethod
    def latest(cls, num_versions=1):
        if not isinstance(num_versions, int) or num_versions < 1:
            raise ValueError(f"latest: num_versions must be an int >= 1, received "
                             f"{num_versions!r}.")
        return cls("latest", num_versions)

    @classmethod
    def all(cls):
        return cls("all", None)

    @classmethod
    def specific(cls, versions):
        versions = tuple(sorted(set(int(v) for v in versions)))
        if not versions:
            raise ValueError("specific: name at least one version.")
        return cls("specific", versions)

    def choose(self, found):
        """The versions of `found` (ints) to serve, sorted."""
        found = sorted(found)
        if self.kind == "latest":
            return found[-self.versions:]
        if self.kind == "specific":
            return [v for v in found if v in self.versions]
        return found

    def __str__(self):
        if self.kind == "latest":
            return f"latest {self.versions}"
        if self.kind == "specific":
            return "specific " + ", ".join(map(str, self.versions))
        return "all"


def release_memory():
    """Collects garbage and hands the C allocator's free pages back to the
    system (glibc's `malloc_trim`), so the memory of an unloaded version
    does not stay with the process."""
    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc
        return
    trim(0)


class VersionManager:
    """Serves the versions under `base_path` that `policy` chooses (see the
    module docstring).

    Args:
        base_path: the model's directory (`saved_models/<name>`).
        poll_wait_seconds: seconds between looks for new versions; 0 or
            less: look only at start (no retries then).
        load: `(path, version) -> servable`, `load_servable` by default
            (tests pass a fake).
        policy: a `VersionPolicy` (default: the newest version).
        max_num_load_retries: tries after a failed load (>= 0).
        load_retry_interval: seconds between two tries of one version.
        name: the model's name, for logs and metrics (default: the base
            path's last component).
        metrics: a `serving.metrics.Metrics` to record load and warm-up
            latencies in, or None.
    """

    def __init__(self, base_path, poll_wait_seconds=1.0, load=load_servable,
                 policy=None, max_num_load_retries=5, load_retry_interval=60.0,
                 name=None, metrics=None):
        if not isinstance(max_num_load_retries, int) or max_num_load_retries < 0:
            raise ValueError(f"max_num_load_retries must be an int >= 0, received "
                             f"{max_num_load_retries!r}.")
        if load_retry_interval < 0:
            raise ValueError(f"load_retry_interval must be >= 0, received "
                             f"{load_retry_interval!r}.")
        self.base_path = os.path.abspath(base_path)
        self.poll_wait_seconds = poll_wait_seconds
        self.policy = policy or VersionPolicy.latest(1)
        self.max_num_load_retries = max_num_load_retries
        self.load_retry_interval = load_retry_interval
        self.name = name or os.path.basename(self.base_path.rstrip(os.sep))
        self.metrics = metrics
        self._load = load
        # version -> servable; replaced whole, never mutated, so a reader
        # needs no lock.
        self._servables = {}
        # version -> [state, error message]; guarded by _lock.
        self._states = {}
        # version -> (failed tries, monotonic time of the last, the
        # directory's stamp then); guarded by _looking.
        self._failures = {}
        self._lock = threading.Lock()
        self._looking = threading.Lock()  # one look at the base path at a time
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        """Loads the versions the policy wants (for the newest N, falling
        back to older versions when newer ones fail), then starts polling.

        Returns: the newest served version (int).
        Raises: `NoServableVersion` naming the base path when no version
        loads.
        """
        if not os.path.isdir(self.base_path):
            raise NoServableVersion(f"--model-base-path {self.base_path} is not a directory.")
        found = servable_versions(self.base_path)
        if not found:
            hint = ""
            if os.path.isfile(os.path.join(self.base_path, "saved_model.pb")):
                hint = (" It holds saved_model.pb itself: point --model-base-path at its "
                        "parent directory, whose integer subdirectories are the versions.")
            raise NoServableVersion(
                f"No servable version under {self.base_path}: expected integer version "
                f"directories holding saved_model.pb (e.g. {self.base_path}/1/saved_model.pb) "
                "or a CTranslate2 export (kt-export --format ctranslate2)."
                + hint)
        with self._looking:
            failed = self._load_wanted(found)
        if not self._servables:
            if not failed:
                raise NoServableVersion(
                    f"No version under {self.base_path} matches the version policy "
                    f"({self.policy}); versions found: {', '.join(map(str, found))}.")
            errors = "; ".join(f"version {v}: {self._states[v][1]}" for v in sorted(
                failed, reverse=True))
            raise NoServableVersion(f"No version under {self.base_path} loads ({errors}).")
        if self.poll_wait_seconds > 0:
            self._thread = threading.Thread(target=self._poll, name="kt-serve-versions",
                                            daemon=True)
            self._thread.start()
        return max(self._servables)

    def _load_wanted(self, found):
        """Loads the versions the policy wants of `found`, falling back
        to older ones for those that fail; returns the failed versions."""
        failed = set()
        while True:
            wanted = self.policy.choose([v for v in found if v not in failed])
            missing = [v for v in reversed(wanted) if v not in self._servables]
            if not missing:
                break
            for version in missing:
                # Retries wait for the poller, so a broken version never
                # holds up the start.
                if not self._try_load(version, retry=self.poll_wait_seconds > 0):
                    failed.add(version)
        return failed

    def stop(self):
        """Stops polling (a load under way finishes in the background)."""
        self._stop.set()

    def set_policy(self, policy):
        """Serves by `policy` from the next poll on."""
        self.policy = policy

    def get(self, version=None):
        """The servable for `version` (None: the newest served), or None if
        that version is not served."""
        servables = self._servables  # one read: a swap may happen meanwhile
        if not servables:
            return None
        if version is None:
            return servables[max(servables)]
        return servables.get(version)

    def served_versions(self):
        """The versions served now, sorted."""
        return sorted(self._servables)

    def status(self, version=None):
        """`(version, state, error message)` of each version this manager
        tried (or of `version` alone), newest first; `[]` for a version
        it never saw."""
        with self._lock:
            entries = [(v, state, error) for v, (state, error)
                       in sorted(self._states.items(), reverse=True)]
        return [e for e in entries if version is None or e[0] == version]

    def _set(self, version, state, error=""):
        with self._lock:
            self._states[version] = [state, error]

    def _try_load(self, version, retry=True):
        """Loads `version` and serves it beside the others; on failure
        records the error (state LOADING while tries are left and `retry`,
        else END). Returns whether it loaded."""
        path = os.path.join(self.base_path, str(version))
        self._set(version, "LOADING")
        LOGGER.info("Loading %s version %d from %s", self.name, version, path)
        start = time.monotonic()
        try:
            servable = self._load(path, version)
        except Exception as e:  # any failure is the version's, reported in its status
            tries = self._failures.get(version, (0,))[0] + 1
            self._failures[version] = (tries, time.monotonic(), directory_stamp(path))
            left = self.max_num_load_retries + 1 - tries if retry else 0
            error = f"{type(e).__name__}: {e}"
            if left > 0:
                LOGGER.warning("%s version %d failed to load (try %d of %d, next in %g s): %s",
                               self.name, version, tries, self.max_num_load_retries + 1,
                               self.load_retry_interval, error)
                self._set(version, "LOADING", error)
            else:
                LOGGER.exception("%s version %d failed to load; serving stays as it was",
                                 self.name, version)
                self._set(version, "END", error)
            if self.metrics is not None:
                self.metrics.observe_load(path, time.monotonic() - start, None, ok=False)
            return False
        self._failures.pop(version, None)
        self._servables = {**self._servables, version: servable}
        self._set(version, "AVAILABLE")
        LOGGER.info("Serving %s version %d (loaded in %.1f s)", self.name, version,
                    time.monotonic() - start)
        if self.metrics is not None:
            self.metrics.observe_load(path, getattr(servable, "load_seconds", None),
                                      getattr(servable, "warmup_seconds", None), ok=True)
        return True

    def _unload(self, versions):
        """Stops serving `versions`; their memory goes once the requests
        still running on them let go."""
        kept = {v: s for v, s in self._servables.items() if v not in versions}
        self._servables = kept
        for version in versions:
            self._set(version, "END")
            LOGGER.info("Unloaded %s version %d", self.name, version)
        release_memory()

    def unload_all(self):
        """Stops serving every version (the model left the config)."""
        if self._servables:
            self._unload(list(self._servables))

    def _due(self, version):
        """Whether `version` may be tried now: never tried, or tries left
        and the retry interval passed since the last."""
        tries, last, _ = self._failures.get(version, (0, None, None))
        return last is None or (tries <= self.max_num_load_retries
                                and time.monotonic() - last >= self.load_retry_interval)

    def poll_once(self):
        """One look at the base path: loads the versions the policy wants
        that are due (newest first), then unloads the served ones it no
        longer wants, once one it wants serves. A version removed from
        disk stops being wanted (for the newest N, an older one then
        takes its place, as in TF Serving). A failed version whose
        directory changed since its last try starts its tries afresh
        (the retry interval after the last)."""
        with self._looking:
            found = servable_versions(self.base_path)
            for version, (_, last, stamp) in list(self._failures.items()):
                now = directory_stamp(os.path.join(self.base_path, str(version)))
                if now != stamp:  # tries afresh, still the interval apart
                    self._failures[version] = (0, last, now)
            given_up = {v for v, (tries, _, _) in self._failures.items()
                        if tries > self.max_num_load_retries}
            wanted = self.policy.choose([v for v in found if v not in given_up])
            for version in reversed(wanted):
                if self._stop.is_set():
                    return
                if version not in self._servables and self._due(version):
                    self._try_load(version)
            stale = [v for v in self._servables if v not in wanted]
            if stale and any(v in self._servables for v in wanted):
                self._unload(stale)

    def _poll(self):
        while not self._stop.wait(self.poll_wait_seconds):
            try:
                self.poll_once()
            except Exception:  # keep polling whatever one look met
                LOGGER.exception("Looking for new versions under %s failed", self.base_path)
