"""Server-side batching, as TF Serving's `--enable_batching`: concurrent
predict requests that can share one model call are merged into one.

Which requests merge: those for the same version and signature, with equal
values of every input but `text`, on a signature whose only non-scalar
input is `text` (shape [batch]) and whose outputs all have shape [batch]
(`batchable`): serving_default, translate_with_options, translate_xla,
translate_sample. Other signatures run unbatched.

How (`BatchScheduler`): a request joins the open batch of its key, or opens
one. A batch closes when it holds `max_batch_size` sentences, or when a
request would overflow it (that request opens the next batch). A batch runs
on one of `num_batch_threads` worker threads when it is closed or
`batch_timeout_micros` have passed since its first request, whichever comes
first, as soon as a thread is free; until it starts, a batch past its
timeout still takes requests up to `max_batch_size`. A request with more
sentences than `max_batch_size` is refused (`TaskTooLarge`, HTTP 400, TF
Serving's answer and message), so no request makes a larger batch. At most
`max_enqueued_batches` batches wait (open or closed, not started); a request
that needs one more gets `QueueFull` (HTTP 503, as TF Serving answers).

Each request gets exactly its own rows of every output back. An error of the
merged call (e.g. the model rejecting the shared options) goes to every
request of that batch.
"""

import asyncio
import collections
import concurrent.futures
import threading

import numpy as np

BATCHED_INPUT = "text"
QUEUE_FULL_MESSAGE = "The batch scheduling queue to which this task was submitted is full"


class QueueFull(Exception):
    """`max_enqueued_batches` batches wait already (HTTP 503 UNAVAILABLE)."""


class TaskTooLarge(ValueError):
    """A request with more sentences than `max_batch_size` (HTTP 400, as TF
    Serving answers it)."""


def batchable(spec):
    """Whether requests for a signature (`rest_api.SignatureSpec`) can be
    merged: its only non-scalar input is `text` of shape [batch], and every
    output has shape [batch]."""
    text = spec.inputs.get(BATCHED_INPUT)
    if text is None or len(text.shape) != 1:
        return False
    if any(len(s.shape) for name, s in spec.inputs.items() if name != BATCHED_INPUT):
        return False
    return all(len(s.shape) == 1 for s in spec.outputs.values())


def batch_key(inputs):
    """What requests must share to merge (besides version and signature):
    the dtype, shape and values of every input but `text`."""
    return tuple(sorted(
        (name, value.dtype.str, value.shape,
         # An object array's bytes are pointers: compare its values.
         tuple(value.ravel().tolist()) if value.dtype == object else value.tobytes())
        for name, value in inputs.items() if name != BATCHED_INPUT))


class _Batch:
    __slots__ = ("closed", "deadline", "items", "key", "rows", "run")

    def __init__(self, key, run, deadline):
        self.key = key
        self.run = run
        self.items = []  # (inputs, rows, future)
        self.rows = 0
        self.deadline = deadline
        self.closed = False


class BatchScheduler:
    """Merges requests into batches (see the module docstring). Its
    coroutines run on one asyncio event loop; model calls run on its own
    worker threads.

    Args:
        max_batch_size: most sentences in one merged call (>= 1).
        batch_timeout_micros: longest wait of a batch's first request for
            more to join (>= 0).
        max_enqueued_batches: most batches waiting to run (>= 1).
        num_batch_threads: batches that run at once (>= 1).
        metrics: a `metrics.Metrics` to record each batch's size in, or
            None.
    """

    def __init__(self, max_batch_size=32, batch_timeout_micros=2000,
                 max_enqueued_batches=64, num_batch_threads=1, metrics=None):
        for name, value, low in (("max_batch_size", max_batch_size, 1),
                                 ("batch_timeout_micros", batch_timeout_micros, 0),
                                 ("max_enqueued_batches", max_enqueued_batches, 1),
                                 ("num_batch_threads", num_batch_threads, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"`{name}` must be an int >= {low}, received {value!r}.")
        self.max_batch_size = max_batch_size
        self.batch_timeout = batch_timeout_micros / 1e6
        self.max_enqueued_batches = max_enqueued_batches
        self.num_batch_threads = num_batch_threads
        self.metrics = metrics
        self._executor = concurrent.futures.ThreadPoolExecutor(
            num_batch_threads, thread_name_prefix="kt-serve-batch")
        self._waiting = []  # not started, oldest first
        self._open = {}  # key -> the batch that still takes requests
        self._running = 0
        self._timer = None
        self._lock = threading.Lock()  # guards the statistics, read from any thread
        self._stats = collections.Counter()
        self._largest = {"requests": 0, "rows": 0}

    async def submit(self, key, inputs, run):
        """Runs `inputs` (`{name: np.ndarray}`, `text` of shape [n]) merged
        with other requests of the same `key`.

        Args:
            key: hashable; requests merge only with equal keys (include the
                version, the signature and `batch_key(inputs)`).
            inputs: this request's inputs.
            run: `merged inputs -> {name: np.ndarray}`, called on a worker
                thread with the batch's inputs (the same for every request
                of a key).

        Returns: `{name: np.ndarray}`, this request's rows of each output.
        Raises: `TaskTooLarge` (more rows than `max_batch_size`),
        `QueueFull`; whatever `run` raised for the batch.
        """
        loop = asyncio.get_running_loop()
        rows = len(inputs[BATCHED_INPUT])
        future = loop.create_future()
        if rows > self.max_batch_size:
            raise TaskTooLarge(f"Task size {rows} is larger than maximum input batch size "
                               f"{self.max_batch_size}")
        batch = self._open.get(key)
        if batch is not None and batch.rows + rows > self.max_batch_size:
            self._close(batch)
            batch = None
        if batch is None:
            batch = self._new_batch(key, run, loop)
        batch.items.append((inputs, rows, future))
        batch.rows += rows
        if batch.rows >= self.max_batch_size:
            self._close(batch)
        self._dispatch(loop)
        return await future

    def statistics(self):
        """Counters since start: `batches` run, `requests` and `rows` in
        them, `merged_batches` (batches of several requests),
        `largest_batch` (`{"requests", "rows"}`), `queue_full` (requests
        refused), `waiting` and `running` batches now, and the settings."""
        with self._lock:
            stats = {name: self._stats[name] for name in
                     ("batches", "requests", "rows", "merged_batches", "queue_full")}
            stats["largest_batch"] = dict(self._largest)
        stats.update(waiting=len(self._waiting), running=self._running,
                     max_batch_size=self.max_batch_size,
                     batch_timeout_micros=round(self.batch_timeout * 1e6),
                     max_enqueued_batches=self.max_enqueued_batches,
                     num_batch_threads=self.num_batch_threads)
        return stats

    def shutdown(self):
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _new_batch(self, key, run, loop):
        if len(self._waiting) >= self.max_enqueued_batches:
            with self._lock:
                self._stats["queue_full"] += 1
            raise QueueFull(QUEUE_FULL_MESSAGE)
        batch = _Batch(key, run, loop.time() + self.batch_timeout)
        self._waiting.append(batch)
        self._open[key] = batch
        return batch

    def _close(self, batch):
        batch.closed = True
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]

    def _dispatch(self, loop):
        """Starts the batches that are due while threads are free; sets a
        timer for the next deadline otherwise."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = loop.time()
        while self._running < self.num_batch_threads:
            due = next((b for b in self._waiting if b.closed or b.deadline <= now), None)
            if due is None:
                break
            self._waiting.remove(due)
            self._close(due)
            self._running += 1
            done = loop.run_in_executor(self._executor, _run_batch, due)
            done.add_done_callback(lambda f, b=due: self._finished(b, f, loop))
        if self._waiting and self._running < self.num_batch_threads:
            deadline = min(b.deadline for b in self._waiting)
            self._timer = loop.call_at(deadline, self._dispatch, loop)

    def _finished(self, batch, done, loop):
        self._running -= 1
        with self._lock:
            self._stats["batches"] += 1
            self._stats["requests"] += len(batch.items)
            self._stats["rows"] += batch.rows
            self._stats["merged_batches"] += len(batch.items) > 1
            if len(batch.items) > self._largest["requests"]:
                self._largest = {"requests": len(batch.items), "rows": batch.rows}
        if self.metrics is not None:
            self.metrics.observe_batch(batch.rows)
        if done.cancelled():
            error = asyncio.CancelledError()
        else:
            error = done.exception()
        for i, (_, _, future) in enumerate(batch.items):
            if future.done():  # the client went away
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(done.result()[i])
        self._dispatch(loop)


def _run_batch(batch):
    """On a worker thread: one call for the whole batch, split back into
    each request's rows. Returns one outputs dict per request."""
    first = batch.items[0][0]
    if len(batch.items) == 1:
        merged = first
    else:
        merged = dict(first)
        merged[BATCHED_INPUT] = np.concatenate([inputs[BATCHED_INPUT]
                                                for inputs, _, _ in batch.items])
    outputs = batch.run(merged)
    for name, value in outputs.items():
        if np.ndim(value) == 0 or len(value) != batch.rows:
            raise RuntimeError(f"output '{name}' of a batched call has shape "
                               f"{list(np.shape(value))}, expected [{batch.rows}, ...].")
    results, start = [], 0
    for _, rows, _ in batch.items:
        results.append({name: value[start:start + rows] for name, value in outputs.items()})
        start += rows
    return results
