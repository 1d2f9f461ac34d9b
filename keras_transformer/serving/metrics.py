"""kt-serve's metrics in Prometheus' text format, kept and written by
`prometheus-client`, under TF Serving's metric names, so dashboards and
alerts written for TF Serving read kt-serve too.

TF Serving names a metric `/tensorflow/serving/request_count` and exports it
to Prometheus as `:tensorflow:serving:request_count` (every `/` a `:`); the
same here:

- `:tensorflow:serving:request_count{model_name, status}`: requests
  answered, `status` "OK" or the error's canonical code
  (`INVALID_ARGUMENT`, `NOT_FOUND`, `UNAVAILABLE`, ...).
- `:tensorflow:serving:request_latency{model_name, API, entrypoint}`: a
  histogram of request wall time in microseconds (`API` "predict",
  `entrypoint` "REST" or "GRPC"), TF Serving's buckets (10 * 1.8^i).
- `:tensorflow:serving:batching_session:input_batch_size`: a histogram of
  the sentences in each merged batch (with --enable-batching).
- `:tensorflow:serving:model_warmup_latency{model_path, status}`: a
  histogram of warm-up wall time in microseconds.
- `:tensorflow:cc:saved_model:load_latency{model_path}`: a counter of the
  microseconds spent loading SavedModels.
- `:tensorflow:serving:queue_full_count{model_name}` (kt-serve's own): requests
  refused because a queue was full.

A `model_name` is a model the server serves, or `UNKNOWN_MODEL` for every
name it does not: a client's text never becomes a series of its own, so the
number of series stays bounded whatever clients send. The other labels come
from the server: a fixed set of codes and entrypoints, and the version
directories it loaded (`model_path`).
"""

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The one `model_name` of requests naming a model the server does not serve.
UNKNOWN_MODEL = "<unknown>"
# TF Serving's latency buckets: 10 us * 1.8^i, 33 of them (about 20 minutes).
LATENCY_BUCKETS = tuple(10 * 1.8 ** i for i in range(33))
BATCH_SIZE_BUCKETS = tuple(float(2 ** i) for i in range(15))

REQUEST_COUNT = "/tensorflow/serving/request_count"
REQUEST_LATENCY = "/tensorflow/serving/request_latency"
INPUT_BATCH_SIZE = "/tensorflow/serving/batching_session/input_batch_size"
WARMUP_LATENCY = "/tensorflow/serving/model_warmup_latency"
LOAD_LATENCY = "/tensorflow/cc/saved_model/load_latency"
QUEUE_FULL = "/tensorflow/serving/queue_full_count"

# name -> (type, label names, help text, histogram buckets)
METRICS = {
    REQUEST_COUNT: ("counter", ("model_name", "status"), "The total number of requests.",
                    None),
    REQUEST_LATENCY: ("histogram", ("model_name", "API", "entrypoint"),
                      "Distribution of wall time (in microseconds) for a request.",
                      LATENCY_BUCKETS),
    INPUT_BATCH_SIZE: ("histogram", (), "Sentences in each merged batch.",
                       BATCH_SIZE_BUCKETS),
    WARMUP_LATENCY: ("histogram", ("model_path", "status"),
                     "Distribution of wall time (in microseconds) for warming up the model.",
                     LATENCY_BUCKETS),
    LOAD_LATENCY: ("counter", ("model_path",), "Microseconds spent loading SavedModels.",
                   None),
    QUEUE_FULL: ("counter", ("model_name",), "Requests refused because a queue was full.",
                 None),
}


def prometheus_name(name):
    """TF Serving's Prometheus name of a metric: every `/` becomes `:`.

    Example:

    >>> prometheus_name("/tensorflow/serving/request_count")
    ':tensorflow:serving:request_count'
    """
    return name.replace("/", ":")


class Metrics:
    """Counters and histograms, safe to update from any thread, in a
    `prometheus_client.CollectorRegistry` of their own (`registry`).

    Callers pass a served model's name, or `UNKNOWN_MODEL`, as `model_name`.

    Example:

    >>> metrics = Metrics()
    >>> metrics.observe_request("demo", "OK", 1500.0, "REST")
    >>> ':tensorflow:serving:request_count{model_name="demo",status="OK"} 1.0' \\
    ...     in metrics.exposition()
    True
    """

    def __init__(self):
        self._metrics = {}
        for name, (kind, labels, text, buckets) in METRICS.items():
            if kind == "counter":
                metric = Counter(prometheus_name(name), text, labels, registry=None)
            else:
                metric = Histogram(prometheus_name(name), text, labels, registry=None,
                                   buckets=buckets)
            self._metrics[name] = metric
        self.registry = CollectorRegistry()
        self.registry.register(_TFServingNames(self._metrics.values()))

    def _child(self, name, labels):
        metric = self._metrics[name]
        return metric.labels(*labels) if labels else metric

    def observe_request(self, model_name, status, microseconds, entrypoint, api="predict"):
        """One request answered with `status` ("OK" or a canonical error
        code name) after `microseconds`."""
        self._child(REQUEST_COUNT, (model_name, status)).inc()
        self._child(REQUEST_LATENCY, (model_name, api, entrypoint)).observe(microseconds)

    def observe_batch(self, rows):
        """One merged batch of `rows` sentences ran."""
        self._child(INPUT_BATCH_SIZE, ()).observe(float(rows))

    def observe_queue_full(self, model_name):
        self._child(QUEUE_FULL, (model_name,)).inc()

    def observe_load(self, model_path, load_seconds, warmup_seconds, ok=True):
        """A version at `model_path` loaded (`ok`) in `load_seconds` and
        warmed up in `warmup_seconds` (None: not measured)."""
        if ok and load_seconds is not None:
            self._child(LOAD_LATENCY, (model_path,)).inc(load_seconds * 1e6)
        if warmup_seconds is not None:
            self._child(WARMUP_LATENCY, (model_path, "OK" if ok else "UNKNOWN")).observe(
                warmup_seconds * 1e6)

    def value(self, name, labels=()):
        """A counter's value, or a histogram's count (0 if never set)."""
        kind, label_names, _, _ = METRICS[name]
        sample = prometheus_name(name) + ("_count" if kind == "histogram" else "")
        value = self.registry.get_sample_value(sample, dict(zip(label_names, labels)))
        return value or 0.0

    def exposition(self):
        """Every metric, in Prometheus' text format 0.0.4."""
        text = generate_latest(self.registry).decode("utf-8")
        # The library heads a counter `<name>_total`; TF Serving's have no suffix.
        for name, (kind, _, _, _) in METRICS.items():
            if kind == "counter":
                for line in ("# HELP", "# TYPE"):
                    text = text.replace(f"{line} {prometheus_name(name)}_total ",
                                        f"{line} {prometheus_name(name)} ")
        return text


class _TFServingNames:
    """A collector of `metrics`' families with TF Serving's sample names: a
    counter's sample is the counter's name (no `_total`), and no
    `_created` samples."""

    def __init__(self, metrics):
        self.metrics = tuple(metrics)

    def describe(self):
        return [family for metric in self.metrics for family in metric.describe()]

    def collect(self):
        for metric in self.metrics:
            for family in metric.collect():
                renamed = Metric(family.name, family.documentation, family.type)
                for sample in family.samples:
                    if sample.name == family.name + "_created":
                        continue
                    name = family.name if family.type == "counter" else sample.name
                    renamed.add_sample(name, sample.labels, sample.value)
                yield renamed
