"""kt-serve's metrics in Prometheus' text format, under TF Serving's metric
names, so dashboards and alerts written for TF Serving read kt-serve too.

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
"""

import collections
import math
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# TF Serving's latency buckets: 10 us * 1.8^i, 33 of them (about 20 minutes).
LATENCY_BUCKETS = tuple(10 * 1.8 ** i for i in range(33))
BATCH_SIZE_BUCKETS = tuple(float(2 ** i) for i in range(15))

REQUEST_COUNT = "/tensorflow/serving/request_count"
REQUEST_LATENCY = "/tensorflow/serving/request_latency"
INPUT_BATCH_SIZE = "/tensorflow/serving/batching_session/input_batch_size"
WARMUP_LATENCY = "/tensorflow/serving/model_warmup_latency"
LOAD_LATENCY = "/tensorflow/cc/saved_model/load_latency"
QUEUE_FULL = "/tensorflow/serving/queue_full_count"

_HELP = {
    REQUEST_COUNT: ("counter", ("model_name", "status"), "The total number of requests."),
    REQUEST_LATENCY: ("histogram", ("model_name", "API", "entrypoint"),
                      "Distribution of wall time (in microseconds) for a request."),
    INPUT_BATCH_SIZE: ("histogram", (), "Sentences in each merged batch."),
    WARMUP_LATENCY: ("histogram", ("model_path", "status"),
                     "Distribution of wall time (in microseconds) for warming up the model."),
    LOAD_LATENCY: ("counter", ("model_path",),
                   "Microseconds spent loading SavedModels."),
    QUEUE_FULL: ("counter", ("model_name",), "Requests refused because a queue was full."),
}


def prometheus_name(name):
    """TF Serving's Prometheus name of a metric: every `/` becomes `:`.

    Example:

    >>> prometheus_name("/tensorflow/serving/request_count")
    ':tensorflow:serving:request_count'
    """
    return name.replace("/", ":")


class Metrics:
    """Counters and histograms, safe to update from any thread.

    Example:

    >>> metrics = Metrics()
    >>> metrics.observe_request("demo", "OK", 1500.0, "REST")
    >>> ':tensorflow:serving:request_count{model_name="demo",status="OK"} 1' \\
    ...     in metrics.exposition()
    True
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._counters = collections.defaultdict(float)  # (name, labels) -> value
        # (name, labels) -> [bucket counts..., sum, count]
        self._histograms = {}

    def _add(self, name, labels, value=1.0):
        with self._lock:
            self._counters[(name, labels)] += value

    def _observe(self, name, labels, value, buckets):
        with self._lock:
            entry = self._histograms.get((name, labels))
            if entry is None:
                entry = self._histograms[(name, labels)] = [buckets, [0] * len(buckets),
                                                            0.0, 0]
            _, counts, _, _ = entry
            for i, bound in enumerate(buckets):
                if value <= bound:
                    counts[i] += 1
                    break
            entry[2] += value
            entry[3] += 1

    def observe_request(self, model_name, status, microseconds, entrypoint, api="predict"):
        """One request answered with `status` ("OK" or a canonical error
        code name) after `microseconds`."""
        self._add(REQUEST_COUNT, (model_name, status))
        self._observe(REQUEST_LATENCY, (model_name, api, entrypoint), microseconds,
                      LATENCY_BUCKETS)

    def observe_batch(self, rows):
        """One merged batch of `rows` sentences ran."""
        self._observe(INPUT_BATCH_SIZE, (), float(rows), BATCH_SIZE_BUCKETS)

    def observe_queue_full(self, model_name):
        self._add(QUEUE_FULL, (model_name,))

    def observe_load(self, model_path, load_seconds, warmup_seconds, ok=True):
        """A version at `model_path` loaded (`ok`) in `load_seconds` and
        warmed up in `warmup_seconds` (None: not measured)."""
        if ok and load_seconds is not None:
            self._add(LOAD_LATENCY, (model_path,), load_seconds * 1e6)
        if warmup_seconds is not None:
            self._observe(WARMUP_LATENCY, (model_path, "OK" if ok else "UNKNOWN"),
                          warmup_seconds * 1e6, LATENCY_BUCKETS)

    def value(self, name, labels=()):
        """A counter's value, or a histogram's count (0 if never set)."""
        with self._lock:
            if (name, tuple(labels)) in self._histograms:
                return self._histograms[(name, tuple(labels))][3]
            return self._counters.get((name, tuple(labels)), 0.0)

    def exposition(self):
        """Every metric set so far, in Prometheus' text format 0.0.4."""
        with self._lock:
            counters = sorted(self._counters.items())
            histograms = sorted((key, (b, list(c), s, n))
                                for key, (b, c, s, n) in self._histograms.items())
        lines, described = [], set()
        for (name, labels), value in counters:
            _describe(lines, described, name)
            lines.append(f"{prometheus_name(name)}{_labels(name, labels)} {_number(value)}")
        for (name, labels), (buckets, counts, total, count) in histograms:
            _describe(lines, described, name)
            base = prometheus_name(name)
            cumulative = 0
            for bound, bucket_count in zip(buckets, counts):
                cumulative += bucket_count
                lines.append(f"{base}_bucket{_labels(name, labels, le=_number(bound))} "
                             f"{cumulative}")
            lines.append(f"{base}_bucket{_labels(name, labels, le='+Inf')} {count}")
            lines.append(f"{base}_sum{_labels(name, labels)} {_number(total)}")
            lines.append(f"{base}_count{_labels(name, labels)} {count}")
        return "\n".join(lines) + "\n"


def _describe(lines, described, name):
    if name in described:
        return
    described.add(name)
    kind, _, text = _HELP[name]
    lines.append(f"# HELP {prometheus_name(name)} {text}")
    lines.append(f"# TYPE {prometheus_name(name)} {kind}")


def _labels(name, values, le=None):
    pairs = list(zip(_HELP[name][1], values))
    if le is not None:
        pairs.append(("le", le))
    if not pairs:
        return ""
    return "{" + ",".join(f'{key}="{_escape(str(value))}"' for key, value in pairs) + "}"


def _escape(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value):
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))
