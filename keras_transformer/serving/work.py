"""The work a predict request asks of a translation model, bounded before it
runs, and its split into chunks that a deadline or a departed client can
stop between.

A search keeps, for every hypothesis (sentence x beam), the decoder's
keys and values over the source and the target so far, for the longest
sentence of the batch (the batch is padded to it). Its memory therefore
grows with

    work = sentences x beam x (source pieces + target limit)

with `source pieces` the longest sentence's, at most the export's
`max_source_tokens`, and `target limit = min(source pieces + 1 +
extra_length, max_length)`, the package's decoding limit. Before the model
runs the pieces are not known, so a sentence of `b` UTF-8 bytes counts as
`min(b + 1, max_source_tokens)` pieces: a SentencePiece piece covers at
least one byte, and eos is one more. A `source_ids` input counts its
length. Sampling signatures search one hypothesis per sentence; n-best
searches `beam_size`.

The memory one unit of work costs on an export is measured by
`python -m benchmarks serve-work` (docs/performance.md).
"""

import numpy as np

from keras_transformer.decoding import search_options
from keras_transformer.serving import limits
from keras_transformer.serving.rest_api import RestError, check_rows

TEXT_INPUT = "text"
IDS_INPUT = "source_ids"


class WorkModel:
    """What a servable's work depends on, from its metadata.

    Args:
        metadata: the servable's `metadata`: `beam_size` and
            `extra_length` (its defaults), `max_source_tokens`, and
            `max_length` (or `config["max_length"]`), and
            `output_vocab_size` (or `config`'s vocabulary sizes).
    """

    def __init__(self, metadata):
        config = metadata.get("config") or {}
        self.max_length = int(metadata.get("max_length") or config.get("max_length") or 512)
        self.max_source_tokens = int(metadata.get("max_source_tokens") or self.max_length - 1)
        self.beam_size = int(metadata.get("beam_size") or 4)
        self.extra_length = int(metadata.get("extra_length") or 50)
        # The model's output vocabulary (a SavedModel's config: the target
        # vocabulary, else the shared one), which bounds beam_size.
        vocabulary = (metadata.get("output_vocab_size") or config.get("target_vocab_size")
                      or config.get("vocab_size"))
        self.vocabulary = None if vocabulary is None else int(vocabulary)

    def source_pieces(self, inputs):
        """`(rows,)` int64: each row's source length bound (see the module)."""
        if IDS_INPUT in inputs:
            ids = np.asarray(inputs[IDS_INPUT])
            length = ids.shape[1] if ids.ndim == 2 else 0
            return np.full(len(ids), min(length, self.max_source_tokens), np.int64)
        text = inputs.get(TEXT_INPUT)
        if text is None or np.ndim(text) != 1:
            return np.zeros(0, np.int64)
        sizes = np.fromiter((len(t) if isinstance(t, (bytes, str)) else 0 for t in text),
                            np.int64, len(text))
        return np.minimum(sizes + 1, self.max_source_tokens)

    def hypotheses(self, inputs):
        """Hypotheses searched per sentence: the request's `beam_size` (or
        the export's), 1 for a sampling signature."""
        if "temperature" in inputs and "beam_size" not in inputs:
            return 1
        beam = inputs.get("beam_size")
        return max(1, int(beam)) if beam is not None and np.ndim(beam) == 0 else self.beam_size

    def extra(self, inputs):
        extra = inputs.get("extra_length")
        if extra is not None and np.ndim(extra) == 0:
            return min(max(0, int(extra)), self.max_length)
        return self.extra_length

    def cost(self, rows, longest, hypotheses, extra_length):
        """The work of `rows` sentences padded to `longest` pieces."""
        limit = max(1, min(longest + 1 + extra_length, self.max_length))
        return rows * hypotheses * (longest + limit)

    def measure(self, inputs):
        """`(work, pieces, hypotheses, extra_length)` of a request's
        inputs: its total work and what it was computed from."""
        pieces = self.source_pieces(inputs)
        hypotheses, extra = self.hypotheses(inputs), self.extra(inputs)
        longest = int(pieces.max()) if len(pieces) else 0
        return self.cost(len(pieces), longest, hypotheses, extra), pieces, hypotheses, extra

    def chunks(self, inputs, chunk_work, measured=None):
        """Row slices `[(start, stop), ...]` covering a request in order,
        each of work at most `chunk_work` (a single sentence may exceed it
        alone). One slice when the whole request fits. `measured`:
        `measure(inputs)` when the caller has it already."""
        work, pieces, hypotheses, extra = measured or self.measure(inputs)
        if work <= chunk_work or len(pieces) <= 1:
            return [(0, len(pieces))]
        slices, start, longest = [], 0, 0
        for row, size in enumerate(pieces.tolist()):
            wider = max(longest, size)
            if row > start and self.cost(row + 1 - start, wider, hypotheses, extra) > chunk_work:
                slices.append((start, row))
                start, wider = row, size
            longest = wider
        slices.append((start, len(pieces)))
        return slices


def split_rows(inputs, start, stop, batched=(TEXT_INPUT, IDS_INPUT)):
    """`inputs` with the batched inputs' rows `start:stop`; options (scalars)
    unchanged."""
    return {name: value[start:stop] if name in batched else value
            for name, value in inputs.items()}


def join_rows(parts):
    """The outputs of consecutive row chunks as one: every output
    concatenated along its first axis."""
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def chunkable(spec):
    """Whether a signature's requests can run in row chunks: a `text`
    input of shape [batch], options that are scalars, and outputs whose
    first axis is the batch and whose other axes have fixed sizes."""
    text = spec.inputs.get(TEXT_INPUT)
    if text is None or len(text.shape) != 1:
        return False
    if any(len(s.shape) for name, s in spec.inputs.items() if name != TEXT_INPUT):
        return False
    return all(len(s.shape) >= 1 and all(d is not None for d in s.shape[1:])
               for s in spec.outputs.values())


class RequestLimits:
    """What one predict request may ask of a model: kt-serve checks every
    request against them before the model runs, warm-up requests included.

    Args:
        max_request_sentences: the most sentences (rows) one request may
            hold; None: no limit.
        max_beam_size: the largest `beam_size` a request may ask for; the
            model's own limit, half its vocabulary, still holds.
        max_request_work: the most work (`WorkModel.measure`) one request
            may ask for; 0 or None: no limit.

    Example:
    >>> limits = RequestLimits(max_request_sentences=2)
    >>> class Servable:
    ...     metadata = {"max_length": 16}
    >>> limits.check(Servable(), {"text": np.array([b"a", b"b", b"c"], object)})
    Traceback (most recent call last):
    ...
    keras_transformer.serving.rest_api.RestError: The request holds 3 sentences, \
more than --max-request-sentences (2); send them in several requests.
    """

    def __init__(self, max_request_sentences=limits.DEFAULT_MAX_REQUEST_SENTENCES,
                 max_beam_size=limits.DEFAULT_MAX_BEAM_SIZE,
                 max_request_work=limits.DEFAULT_MAX_REQUEST_WORK):
        self.max_request_sentences = max_request_sentences
        self.max_beam_size = max_beam_size
        self.max_request_work = max_request_work

    def check(self, servable, inputs):
        """Refuses (`RestError`, 400) a request over `max_request_sentences`
        rows, with a search option out of its range
        (`decoding.search_options`, in the SavedModel's words), over
        `max_beam_size` or over `max_request_work`, naming the numbers.

        Args:
            servable: has `metadata` (its `WorkModel` is cached on it as
                `work_model`).
            inputs: `{name: np.ndarray}`.

        Returns: the servable's `WorkModel` and its `measure` of the inputs.
        """
        rows = max((len(value) for value in inputs.values() if np.ndim(value) >= 1),
                   default=0)
        check_rows(rows, self.max_request_sentences)
        model = getattr(servable, "work_model", None)
        if model is None:
            model = servable.work_model = WorkModel(servable.metadata)
        failure = search_options.assertion_failure(
            {name: value for name, value in inputs.items() if np.ndim(value) == 0},
            {"vocabulary": model.vocabulary})
        if failure is not None:
            raise RestError(failure)
        beam_size = inputs.get("beam_size")
        if beam_size is not None and np.ndim(beam_size) == 0 \
                and int(beam_size) > self.max_beam_size:
            raise RestError(f"beam_size {int(beam_size)} is larger than --max-beam-size "
                            f"({self.max_beam_size}).")
        total, pieces, hypotheses, extra = model.measure(inputs)
        if self.max_request_work and total > self.max_request_work:
            longest = int(pieces.max()) if len(pieces) else 0
            raise RestError(
                f"The request asks for {total} units of work, more than --max-request-work "
                f"({self.max_request_work}): {len(pieces)} sentences x {hypotheses} "
                f"hypotheses x ({longest} source pieces, bounded by the longest sentence's "
                f"bytes, + {model.cost(1, longest, 1, extra) - longest} target positions "
                f"with extra_length {extra}). Send fewer sentences, shorter ones or a "
                "smaller beam_size.")
        return model, (total, pieces, hypotheses, extra)
