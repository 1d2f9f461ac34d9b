"""The models one kt-serve serves: names, their versions (a
`model_versions.VersionManager` each) and version labels, from the command
line (one model) or from TF Serving's model config file.

The config file is TF Serving's `ModelServerConfig` in protobuf text format
(`--model-config-file`, see docs/serving.md)::

    model_config_list {
      config {
        name: "demo"
        base_path: "saved_models/demo"
        model_platform: "tensorflow"
        model_version_policy { latest { num_versions: 2 } }
        version_labels { key: "stable" value: 1 }
        version_labels { key: "canary" value: 2 }
      }
    }

Each `config` is served as its `name`, from `base_path` (relative paths
are relative to the file's directory), with its version policy (`latest`,
`all` or `specific`; default the newest version) and labels
(`/v1/models/NAME/labels/LABEL`). With a poll interval the file is read
again when it changes: new models load, removed ones unload, and policies
and labels change in place; a file that no longer parses leaves the served
models as they were (logged). A gRPC `HandleReloadConfigRequest` applies
its config the same way (`ModelConfigWatcher.reload`). Parsing needs TF
Serving's protos (`tensorflow-serving-api`, the `grpc` extra).
"""

import collections
import logging
import os
import threading

from keras_transformer.serving.model_versions import (
    VersionManager,
    VersionPolicy,
    directory_stamp,
)

LOGGER = logging.getLogger("kt-serve")

ModelEntry = collections.namedtuple("ModelEntry", ["name", "base_path", "policy", "labels"])
ModelEntry.__doc__ = """One model of a config file: `name`, `base_path`
(absolute), `policy` (a `VersionPolicy`) and `labels` (`{label: version}`)."""


class ServedModels:
    """The served models by name, and their version labels.

    Args:
        managers: `{name: VersionManager}` (started), in the order the
            playground lists them (the first is its default).
        labels: `{name: {label: version}}`.
    """

    def __init__(self, managers, labels=None):
        self._managers = dict(managers)
        self._labels = {name: dict(v) for name, v in (labels or {}).items()}

    @property
    def names(self):
        return list(self._managers)

    @property
    def default_name(self):
        names = self.names
        return names[0] if names else None

    def get(self, name):
        """The `VersionManager` of model `name`, or None."""
        return self._managers.get(name)

    def labels(self, name):
        """`{label: version}` of model `name`."""
        return dict(self._labels.get(name, {}))

    def label_version(self, name, label):
        """The version `label` names for model `name`, or None."""
        return self._labels.get(name, {}).get(label)

    def managers(self):
        return list(self._managers.values())

    def replace(self, managers, labels):
        """Serves `managers` and `labels` from now on (one assignment
        each; readers never see a half-updated set)."""
        self._managers = dict(managers)
        self._labels = {name: dict(v) for name, v in labels.items()}

    def stop(self):
        for manager in self.managers():
            manager.stop()


def read_model_config(path):
    """The models of TF Serving's model config file at `path`.

    Returns: a list of `ModelEntry`.
    Raises: `ValueError` naming the file (and line and column for a syntax
    error) for a file that does not parse or asks for what kt-serve does
    not serve; `ImportError` without tensorflow-serving-api.
    """
    model_server_config_pb2, text_format = _config_protos()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ValueError(f"--model-config-file {path}: {e}") from None
    return model_entries(config, os.path.dirname(os.path.abspath(path)),
                         f"--model-config-file {path}")


def _config_protos():
    try:
        from google.protobuf import text_format
        from tensorflow_serving.config import model_server_config_pb2
    except ImportError:
        raise ImportError("--model-config-file needs TF Serving's protos: pip install "
                          "'attention-transformer-keras[grpc]'") from None
    return model_server_config_pb2, text_format


def model_entries(config, directory, source):
    """The models of a `ModelServerConfig` proto, relative base paths
    joined to `directory`.

    Returns: a list of `ModelEntry`.
    Raises: `ValueError` starting with `source` (where the config came
    from) for what kt-serve does not serve.
    """
    if config.WhichOneof("config") == "custom_model_config":
        raise ValueError(f"{source}: custom_model_config is not served; "
                         "use model_config_list.")
    entries, seen = [], set()
    for i, model in enumerate(config.model_config_list.config):
        where = f"{source}: config {i + 1}"
        if not model.name:
            raise ValueError(f"{where}: name is empty.")
        where += f" ({model.name})"
        if model.name in seen:
            raise ValueError(f"{where}: the name is used twice.")
        seen.add(model.name)
        if not model.base_path:
            raise ValueError(f"{where}: base_path is empty.")
        if model.model_platform not in ("", "tensorflow"):
            raise ValueError(f"{where}: model_platform '{model.model_platform}'; kt-serve "
                             "serves 'tensorflow' SavedModels.")
        entries.append(ModelEntry(model.name, os.path.join(directory, model.base_path),
                                  _policy(model.model_version_policy, where),
                                  dict(model.version_labels)))
    if not entries:
        raise ValueError(f"{source}: model_config_list names no model.")
    return entries


def _policy(proto, where):
    kind = proto.WhichOneof("policy_choice")
    if kind is None:
        return VersionPolicy.latest(1)
    try:
        if kind == "latest":
            return VersionPolicy.latest(proto.latest.num_versions or 1)
        if kind == "specific":
            return VersionPolicy.specific(proto.specific.versions)
    except ValueError as e:
        raise ValueError(f"{where}: model_version_policy {e}") from None
    return VersionPolicy.all()


class ModelConfigWatcher:
    """Serves the models of a config file and follows its changes.

    Args:
        path: the config file.
        models: the `ServedModels` to fill and update.
        make_manager: `(name, base_path, policy) -> VersionManager`, not
            started.
        poll_wait_seconds: seconds between looks at the file; 0 or less:
            read it only at start.
    """

    def __init__(self, path, models, make_manager, poll_wait_seconds=0.0):
        self.path = path
        self.models = models
        self._make = make_manager
        self.poll_wait_seconds = poll_wait_seconds
        self._entries = {}  # name -> the entry served
        self._failed = {}  # name -> (entry, its base path's stamp) that did not load
        self._stamp = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the poll thread and gRPC reloads apply in turn
        self._thread = None

    def start(self):
        """Reads the file and starts every model (each must load).

        Raises: `ValueError` for a bad file, `NoServableVersion` naming the
        model that has no loadable version.
        """
        with self._lock:
            self._apply(read_model_config(self.path), at_start=True)
        self._stamp = self._read_stamp()
        if self.poll_wait_seconds > 0:
            self._thread = threading.Thread(target=self._poll, name="kt-serve-config",
                                            daemon=True)
            self._thread.start()

    def stop(self):
        self._stop.set()

    def _read_stamp(self):
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def reload(self, config):
        """Serves the models of `config`, a `ModelServerConfig` proto (a
        gRPC `HandleReloadConfigRequest`), as a changed file would be:
        relative base paths are relative to the file's directory.

        Returns: `{name: exception}` of the models that did not load (the
        others are served).
        Raises: `ValueError` naming what is wrong with `config`; nothing
        changes then.
        """
        entries = model_entries(config, os.path.dirname(os.path.abspath(self.path)),
                                "ReloadConfigRequest")
        LOGGER.info("Reloading the model config from a ReloadConfigRequest")
        return self._reload(entries)

    def _reload(self, entries):
        with self._lock:
            failures = self._apply(entries)
            for manager in self.models.managers():
                try:
                    manager.poll_once()
                except Exception:
                    LOGGER.exception("Applying the new version policy of %s failed",
                                     manager.name)
        return failures

    def _apply(self, entries, at_start=False):
        """Serves `entries`; returns `{name: exception}` of the models
        that did not load (raises at start). A model whose new base path
        does not load keeps serving from its old one, as in TF Serving;
        it is tried again when the file or its new base path changes."""
        managers, labels, served, failures, failed = {}, {}, {}, {}, {}
        for entry in entries:
            old = self._entries.get(entry.name)
            serving = self.models.get(entry.name)
            if serving is not None and old is not None and old.base_path == entry.base_path:
                serving.set_policy(entry.policy)
                manager = serving
            else:
                manager = self._make(entry.name, entry.base_path, entry.policy)
                try:
                    manager.start()
                except Exception as e:
                    if at_start:
                        raise type(e)(f"model {entry.name}: {e}") from None
                    keeps = serving is not None and old is not None
                    LOGGER.error("Model %s from %s does not load%s: %s", entry.name, self.path,
                                 "; its old base path keeps serving" if keeps else "", e)
                    failures[entry.name] = e
                    failed[entry.name] = (entry, directory_stamp(entry.base_path))
                    if not keeps:
                        continue
                    manager, entry = serving, old
            managers[entry.name] = manager
            labels[entry.name] = entry.labels
            served[entry.name] = entry
        dropped = [m for name, m in ((n, self.models.get(n)) for n in self.models.names)
                   if name not in managers or managers[name] is not m]
        self.models.replace(managers, labels)
        for manager in dropped:
            manager.stop()
            manager.unload_all()
        self._entries, self._failed = served, failed
        return failures

    def _changed_failures(self):
        """Whether the base path of a model that did not load changed."""
        return any(directory_stamp(entry.base_path) != stamp
                   for entry, stamp in self._failed.values())

    def _poll(self):
        while not self._stop.wait(self.poll_wait_seconds):
            stamp = self._read_stamp()
            changed = stamp != self._stamp
            if stamp is None or not (changed or self._changed_failures()):
                continue
            self._stamp = stamp
            try:
                entries = read_model_config(self.path)
            except Exception as e:  # keep serving what was served
                LOGGER.error("The model config file changed but is not used: %s", e)
                continue
            LOGGER.info("Reloading the model config file %s%s", self.path,
                        "" if changed else " (the base path of a model that did not load "
                        "changed)")
            self._reload(entries)


def single_model(name, manager):
    """`ServedModels` of one model (the command line's `--model-name`)."""
    return ServedModels({name: manager})


ENGINES = ("auto", "savedmodel", "ctranslate2")


def version_loader(engine="auto", compute_type="default", intra_threads=1, inter_threads=1,
                   vocabulary_map="auto", request_limits=None):
    """A `(path, version) -> servable` for `VersionManager`: a SavedModel
    (`model_versions.load_servable`) or a CTranslate2 export
    (`ctranslate2_servable.load_ctranslate2_servable`, with these CTranslate2
    settings and vocabulary map choice), by what the version directory
    holds ("auto") or only the one `engine` names (another kind of version
    fails to load, saying why). Warm-up requests run under
    `request_limits` (a `work.RequestLimits`, or None)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, received {engine!r}.")

    def load(path, version):
        from keras_transformer.serving.ctranslate2_servable import (
            is_ctranslate2_version,
            load_ctranslate2_servable,
        )
        from keras_transformer.serving.model_versions import load_servable

        kind = "ctranslate2" if is_ctranslate2_version(path) else "savedmodel"
        if engine != "auto" and kind != engine:
            names = {"ctranslate2": ("a CTranslate2 export", "CTranslate2 exports"),
                     "savedmodel": ("a SavedModel", "SavedModels")}
            raise ValueError(f"{path} holds {names[kind][0]}; kt-serve --engine {engine} "
                             f"serves {names[engine][1]} only.")
        if kind == "ctranslate2":
            return load_ctranslate2_servable(path, version, compute_type, intra_threads,
                                             inter_threads, vocabulary_map, request_limits)
        return load_servable(path, version, request_limits=request_limits)

    return load


def manager_factory(poll_wait_seconds, max_num_load_retries, load_retry_interval,
                    metrics=None, load=None):
    """A `make_manager` for `ModelConfigWatcher` with these settings."""
    def make(name, base_path, policy):
        options = {} if load is None else {"load": load}
        return VersionManager(base_path, poll_wait_seconds, policy=policy,
                              max_num_load_retries=max_num_load_retries,
                              load_retry_interval=load_retry_interval, name=name,
                              metrics=metrics, **options)
    return make
