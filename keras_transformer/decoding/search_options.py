"""The search options, declared once: name, dtype, default, range, help and
error message of every option a translation request or command may set.

The Python engines (`export.translator.Translator`, the CTranslate2
translator), the SavedModel's graph checks (`export.option_checks`
builds its `tf.debugging.Assert`s from the same fields),
the servers (`serving.app` checks a request's options before it measures
its work) and the command-line flags (`cli.translate`) all read
`OPTIONS`, so that a value one of them refuses, all refuse, with the same
words. docs/api.md#search-options lists the table.

A bound may depend on the model or on another option: `beam_size` is at
most half the output vocabulary (a beam keeps `2 * beam_size` candidates
per step, `top_k` over the vocabulary), and `n` at most `beam_size`.
Such a bound is named by a string, looked up in the `context` mapping the
caller passes (`{"vocabulary": V, "beam_size": B}`); a bound whose context
is missing is not checked.
"""

import dataclasses
import math
import numbers

import numpy as np

# The largest `extra_length` a request may ask for; decoding stops at the
# model's `max_length` anyway, so this only keeps the int32 sum in range.
MAX_EXTRA_LENGTH = 1 << 16

INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


@dataclasses.dataclass(frozen=True)
class SearchOption:
    """One search option.

    Args:
        name: the request input, keyword argument and (with dashes) flag.
        dtype: "int32", "int64" or "float32" (the SavedModel input's).
        default: the value when neither the request nor the export sets
            one (None: the export's setting).
        minimum: the lowest allowed value (None: the dtype's).
        maximum: the highest: a number, a key of the caller's context
            ("vocabulary" means half of it), or None (the dtype's).
        exclusive_minimum: `minimum` itself is refused.
        finite: NaN and infinities are refused (a float option).
        help: one line for flags and docs.

    Example:

    >>> OPTIONS["top_p"].rule()
    'in (0, 1]'
    >>> OPTIONS["beam_size"].problem(9, {"vocabulary": 16})
    'beam_size must be between 1 and 8, received 9'
    """

    name: str
    dtype: str
    default: object
    minimum: object = None
    maximum: object = None
    exclusive_minimum: bool = False
    finite: bool = False
    help: str = ""

    def bounds(self, context=None):
        """`(low, high)` for `context` (None where unbounded or unknown)."""
        high = self.maximum
        if isinstance(high, str):
            value = (context or {}).get(high)
            high = None if value is None else (
                int(value) // 2 if high == "vocabulary" else value)
        return self.minimum, high

    def rule(self, context=None):
        """The allowed values in words: `"between 1 and 8"`, `"a finite
        number >= 0"`, `"in (0, 1]"`, `">= 0"`."""
        low, high = self.bounds(context)
        if not isinstance(high, numbers.Number) and self.maximum is not None:
            # Unknown, or a tensor: the bound's name.
            high = {"vocabulary": "the output vocabulary // 2"}.get(self.maximum, self.maximum)
        if self.exclusive_minimum:
            return f"in ({low:g}, {high:g}]"
        if self.finite:
            return f"a finite number >= {low:g}"
        if high is not None:
            return f"between {low} and {high}"
        if low is not None:
            return f">= {low:g}"
        return f"an {self.dtype}"

    def allows(self, value, context=None):
        """Whether `value` (a Python or NumPy number) is in range."""
        return self.problem(value, context) is None

    def problem(self, value, context=None):
        """None when `value` is allowed, else the error message: `"<name>
        must be <rule>, received <value>"` (or `"must be an <dtype>"` for a
        value of the wrong kind)."""
        value = _plain(value)
        kind = f"{self.name} must be an {self.dtype}, received {value!r}"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return kind
        if self.dtype in INT_RANGES:
            lowest, highest = INT_RANGES[self.dtype]
            if not isinstance(value, numbers.Integral) or not lowest <= value <= highest:
                return kind
        elif math.isnan(value) or (self.finite and math.isinf(value)):
            return f"{self.name} must be {self.rule(context)}, received {value!r}"
        low, high = self.bounds(context)
        if ((low is not None and (value <= low if self.exclusive_minimum else value < low))
                or (high is not None and value > high)):
            return f"{self.name} must be {self.rule(context)}, received {value!r}"
        return None

    def check(self, value, context=None):
        """`value`, or a `ValueError` with `problem`'s message."""
        problem = self.problem(value, context)
        if problem is not None:
            raise ValueError(problem + ".")
        return value


# The defaults of beam search are the paper's (section 6.1): beam 4, alpha
# 0.6, output length <= input + 50. `min_length` 1, as fairseq (--min-len)
# and CTranslate2 (min_decoding_length) default to: a non-empty sentence
# never translates to "".
OPTIONS = {option.name: option for option in [
    SearchOption("beam_size", "int32", 4, minimum=1, maximum="vocabulary",
                 help="hypotheses kept per sentence (1: greedy)"),
    SearchOption("alpha", "float32", 0.6, minimum=0.0, finite=True,
                 help="length penalty: scores are log P / length ** alpha (0: none)"),
    SearchOption("extra_length", "int32", 50, minimum=0, maximum=MAX_EXTRA_LENGTH,
                 help="the longest output is the source's length + this "
                      "(and at most the model's max_length)"),
    SearchOption("min_length", "int32", 1, minimum=0,
                 help="the fewest pieces before eos (0: an empty output is allowed)"),
    SearchOption("n", "int32", 1, minimum=1, maximum="beam_size",
                 help="n-best: translations returned per sentence, best first"),
    SearchOption("temperature", "float32", 1.0, minimum=0.0,
                 help="sampling: divides the log-probabilities; 0 is greedy"),
    SearchOption("top_k", "int32", 0, minimum=0,
                 help="sampling: only the k most probable tokens (0: all)"),
    SearchOption("top_p", "float32", 1.0, minimum=0.0, maximum=1.0,
                 exclusive_minimum=True,
                 help="sampling: only the most probable tokens holding this probability"),
    SearchOption("seed", "int64", 0,
                 help="sampling: the random seed; the same seed gives the same output"),
]}


def _plain(value):
    """A NumPy scalar or 0-d array as its Python number."""
    return value.item() if isinstance(value, (np.ndarray, np.generic)) and value.ndim == 0 \
        else value


def check_options(values, context=None, tensors_pass=False):
    """A `ValueError` naming the first of `values` (`{name: number}`; names
    not in `OPTIONS` and None values are skipped) out of its range.

    `context`: the bounds' context; a given `beam_size` joins it for `n`.
    `tensors_pass`: values that are not numbers (tensors, which a graph
    checks) are skipped rather than refused.

    Example:

    >>> check_options({"beam_size": 4, "n": 2, "alpha": 0.6})
    >>> check_options({"beam_size": 2, "n": 3})
    Traceback (most recent call last):
    ...
    ValueError: n must be between 1 and 2, received 3.
    """
    problem = first_problem(values, context, tensors_pass)
    if problem is not None:
        raise ValueError(problem + ".")


def first_problem(values, context=None, tensors_pass=False):
    """`SearchOption.problem` of the first of `values` out of its range, or
    None; `check_options`' arguments. A given `beam_size` that is a number
    joins `context` as `n`'s bound."""
    context = dict(context or {})
    beam_size = _plain(values.get("beam_size"))
    if isinstance(beam_size, numbers.Number) and "beam_size" not in context:
        context["beam_size"] = beam_size
    for name, value in values.items():
        if name not in OPTIONS or value is None:
            continue
        if tensors_pass and not isinstance(_plain(value), numbers.Number):
            continue
        problem = OPTIONS[name].problem(value, context)
        if problem is not None:
            return problem
    return None


def assertion_failure(values, context=None):
    """None when every one of `values` (as `check_options`) is allowed, else
    the first refusal as a SavedModel's graph check words it, which TF
    Serving returns with InvalidArgument: `"assertion failed: [<name> must
    be <rule>, received] [<value>]"`. Servers answer with it, so that a
    refusal reads the same from every engine.

    Example:

    >>> assertion_failure({"top_k": -1})
    'assertion failed: [top_k must be >= 0, received] [-1]'
    """
    problem = first_problem(values, context)
    if problem is None:
        return None
    words, _, received = problem.rpartition(", received ")
    return f"assertion failed: [{words}, received] [{received}]"
