"""Translate through TF Serving's REST API with nothing but the Python standard library.

Shows the two requests a client of an exported translator makes, in TF
Serving's columnar format, to `POST /v1/models/MODEL:predict`:

    {"signature_name": "serving_default", "inputs": {"text": [...]}}
    {"signature_name": "translate_with_options",
     "inputs": {"text": [...], "beam_size": 8, "alpha": 1.0, "extra_length": 50}}

The answer is `{"outputs": {"translation": [...], "score": [...]}}`; an error
is `{"error": "..."}` with a 4xx or 5xx status. It works the same against
TF Serving and against `kt-serve`.

    python examples/tf_serving/rest_client.py --model demo "the dog sees a cat"
    python examples/tf_serving/rest_client.py --model demo --beam-size 8 --alpha 1.0 \
        --extra-length 50 "the dog sees a cat"

The options go to `translate_with_options`, whose scalar inputs TF Serving's
`--enable_batching` cannot batch (README.md beside this file).
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

# The paper's search options, sent for those not given: TF Serving takes no
# default for a signature input.
PAPER_OPTIONS = {"beam_size": 4, "alpha": 0.6, "extra_length": 50}


def predict(url, model, signature, inputs, timeout=60.0):
    """One `:predict` request; returns the answer's `outputs`, or exits with
    the server's error message."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/models/{model}:predict",
        data=json.dumps({"signature_name": signature, "inputs": inputs}).encode("utf-8"),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)["outputs"]
    except urllib.error.HTTPError as error:
        message = error.read().decode("utf-8", "replace")
        try:
            message = json.loads(message)["error"]
        except (ValueError, KeyError):
            pass
        sys.exit(f"{signature}: the server answered {error.code}: {message}")


def show(title, sentences, outputs):
    print(title)
    for source, translation, score in zip(sentences, outputs["translation"],
                                          outputs["score"]):
        print(f"  {source!r} -> {translation!r}  score {score:.4f}")


def main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("sentences", nargs="+", help="source sentences")
    parser.add_argument("--url", default="http://localhost:8501",
                        help="the server's REST address (default: %(default)s)")
    parser.add_argument("--model", required=True, help="the model name, as in models.config")
    parser.add_argument("--signature", default="serving_default",
                        choices=["serving_default", "translate_xla"],
                        help="translate_xla needs TF Serving's "
                             "--xla_cpu_compilation_enabled=true")
    parser.add_argument("--beam-size", type=int)
    parser.add_argument("--alpha", type=float)
    parser.add_argument("--extra-length", type=int)
    args = parser.parse_args(argv)

    outputs = predict(args.url, args.model, args.signature, {"text": args.sentences})
    show(args.signature, args.sentences, outputs)

    given = {"beam_size": args.beam_size, "alpha": args.alpha,
             "extra_length": args.extra_length}
    if any(value is not None for value in given.values()):
        options = {key: PAPER_OPTIONS[key] if value is None else value
                   for key, value in given.items()}
        outputs = predict(args.url, args.model, "translate_with_options",
                          {"text": args.sentences, **options})
        show("translate_with_options " + " ".join(f"{k}={v}" for k, v in options.items()),
             args.sentences, outputs)


if __name__ == "__main__":
    main()
