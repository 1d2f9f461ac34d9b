"""The versions of one model that kt-serve serves: TF Serving's default
policy, the newest version.

`<base path>/<version>/saved_model.pb` (an integer directory name) is a
version; other names (`.tmp-*`, `latest`, a directory without
saved_model.pb) are ignored. `kt-export` writes a version under a temporary
name and renames it into place, so a version directory that exists is
complete.

`VersionManager.start()` loads the newest loadable version before the
server listens. Then a background thread looks at the base path every
`poll_wait_seconds`; when a version newer than the served one appears it
loads it (`tf.saved_model.load`, then one warm-up call of `serving_default`
on a short sentence) while the old one keeps serving, switches to it in one
assignment, then drops the old one: requests already running on the old
version finish on it, later ones get the new. A version that fails to load
is reported (state END, its error) and the old one keeps serving; it is not
tried again. Versions older than the served one are never loaded.
"""

import logging
import os
import threading
import time

import numpy as np

from keras_transformer.export.engine import SERVING_DEFAULT
from keras_transformer.export.saved_model import versions
from keras_transformer.serving.rest_api import SignatureSpec, TensorSpec

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

    def warm_up(self):
        """One call of `serving_default` on a short sentence (if it takes
        one `text` input), so the first request does not pay for
        TensorFlow's first-call set-up."""
        spec = self.specs.get(SERVING_DEFAULT)
        if spec is not None and set(spec.inputs) == {"text"}:
            self.predict(SERVING_DEFAULT,
                         {"text": np.array([WARM_UP_SENTENCE.encode()], object)})

    def predict(self, signature, inputs):
        """Runs `signature` on `inputs` (`{name: np.ndarray}` matching its
        specs). Blocks; thread-safe.

        Returns: `{output name: np.ndarray}`.
        Raises: `ModelError` when the model rejects the inputs,
        `ModelOverloaded` when they need more memory than there is.
        """
        tf = self._tf
        tensors = {name: tf.constant(value, _tf_dtype(tf, self.specs[signature].inputs[name]))
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


def _tf_dtype(tf, spec):
    return tf.string if spec.dtype == "string" else tf.as_dtype(spec.dtype)


def load_servable(path, version):
    """Loads and warms up the version at `path`."""
    servable = Servable(path, version)
    servable.warm_up()
    return servable


def servable_versions(base_path):
    """The integer version directories under `base_path` (`versions`) that
    hold a saved_model.pb, sorted."""
    return [v for v in versions(base_path)
            if os.path.isfile(os.path.join(base_path, str(v), "saved_model.pb"))]


class VersionManager:
    """Serves the newest version under `base_path` (see the module
    docstring).

    Args:
        base_path: the model's directory (`saved_models/<name>`).
        poll_wait_seconds: seconds between looks for a new version; 0 or
            less: look only at start.
        load: `(path, version) -> servable`, `load_servable` by default
            (tests pass a fake).
    """

    def __init__(self, base_path, poll_wait_seconds=1.0, load=load_servable):
        self.base_path = os.path.abspath(base_path)
        self.poll_wait_seconds = poll_wait_seconds
        self._load = load
        self._servable = None
        # version -> [state, error message]; guarded by _lock.
        self._states = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        """Loads the newest loadable version (newest first, falling back to
        older ones), then starts polling.

        Returns: the served version (int).
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
                f"directories holding saved_model.pb (e.g. {self.base_path}/1/saved_model.pb)."
                + hint)
        for version in reversed(found):
            if self._try_load(version):
                break
        if self._servable is None:
            errors = "; ".join(f"version {v}: {self._states[v][1]}" for v in reversed(found))
            raise NoServableVersion(f"No version under {self.base_path} loads ({errors}).")
        if self.poll_wait_seconds > 0:
            self._thread = threading.Thread(target=self._poll, name="kt-serve-versions",
                                            daemon=True)
            self._thread.start()
        return self._servable.version

    def stop(self):
        """Stops polling (a load under way finishes in the background)."""
        self._stop.set()

    def get(self, version=None):
        """The servable for `version` (None: the newest loaded), or None if
        that version is not loaded."""
        servable = self._servable  # one read: a swap may happen meanwhile
        if servable is None or (version is not None and servable.version != version):
            return None
        return servable

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

    def _try_load(self, version):
        """Loads `version` and serves it; on failure records the error.
        Returns whether it loaded."""
        path = os.path.join(self.base_path, str(version))
        self._set(version, "LOADING")
        LOGGER.info("Loading version %d from %s", version, path)
        start = time.monotonic()
        try:
            servable = self._load(path, version)
        except Exception as e:  # any failure is the version's, reported in its status
            LOGGER.exception("Version %d failed to load; serving stays as it was", version)
            self._set(version, "END", f"{type(e).__name__}: {e}")
            return False
        old, self._servable = self._servable, servable
        self._set(version, "AVAILABLE")
        LOGGER.info("Serving version %d (loaded in %.1f s)", version,
                    time.monotonic() - start)
        if old is not None:
            # Dropping the last reference the server holds unloads it once
            # the requests still running on it let go of theirs.
            self._set(old.version, "END")
        return True

    def _poll(self):
        while not self._stop.wait(self.poll_wait_seconds):
            try:
                found = servable_versions(self.base_path)
                with self._lock:
                    tried = set(self._states)
                current = self._servable.version
                newer = [v for v in found if v > current and v not in tried]
                if newer:
                    self._try_load(newer[-1])
            except Exception:  # keep polling whatever one look met
                LOGGER.exception("Looking for new versions under %s failed", self.base_path)
