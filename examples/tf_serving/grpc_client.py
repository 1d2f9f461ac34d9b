"""Translate through TF Serving's gRPC API (port 8500).

Shows a `PredictRequest` for an exported translator: the model and
signature in `model_spec`, each input a `TensorProto` of its exact dtype
(text string `[batch]`; beam_size int32, alpha float32, extra_length int32,
seed int64, ... as scalars), and the string outputs decoded from bytes.

    pip install 'tensorflow-serving-api==2.21.*'
    python examples/tf_serving/grpc_client.py --model demo "the dog sees a cat"
    python examples/tf_serving/grpc_client.py --model demo --beam-size 8 --alpha 1.0 \
        --extra-length 50 "the dog sees a cat"

`build_request` builds the request for any signature whose inputs are
`text` and scalar options (every signature but `translate_ids`).
"""

import argparse

import tensorflow as tf

# Every scalar input of the signatures, with its dtype.
OPTION_DTYPES = {
    "beam_size": tf.int32, "alpha": tf.float32, "extra_length": tf.int32, "n": tf.int32,
    "temperature": tf.float32, "top_k": tf.int32, "top_p": tf.float32, "seed": tf.int64,
}
PAPER_OPTIONS = {"beam_size": 4, "alpha": 0.6, "extra_length": 50}


def build_request(model, sentences, signature="serving_default", version=None, **options):
    """A `predict_pb2.PredictRequest` for `signature` of `model` (newest
    version unless `version`): `text` from `sentences` (str, sent as UTF-8),
    and each keyword of `options` (a name of `OPTION_DTYPES`) as a scalar
    of its dtype. Needs tensorflow-serving-api."""
    from tensorflow_serving.apis import predict_pb2

    unknown = sorted(set(options) - set(OPTION_DTYPES))
    if unknown:
        raise ValueError(f"Unknown inputs {unknown}; the scalar inputs are "
                         f"{sorted(OPTION_DTYPES)}.")
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = int(version)
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(
        [s.encode("utf-8") for s in sentences], tf.string, shape=[len(sentences)]))
    for name, value in options.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value, OPTION_DTYPES[name]))
    return request


def translations(response):
    """`(translations, scores)` of a `PredictResponse` of a signature with
    `translation` and `score` outputs."""
    texts = tf.make_ndarray(response.outputs["translation"])
    scores = tf.make_ndarray(response.outputs["score"])
    return [t.decode("utf-8") for t in texts], [float(s) for s in scores]


def main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("sentences", nargs="+", help="source sentences")
    parser.add_argument("--target", default="localhost:8500",
                        help="the server's gRPC address (default: %(default)s)")
    parser.add_argument("--model", required=True, help="the model name, as in models.config")
    parser.add_argument("--beam-size", type=int)
    parser.add_argument("--alpha", type=float)
    parser.add_argument("--extra-length", type=int)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    args = parser.parse_args(argv)

    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(
        grpc.insecure_channel(args.target))
    requests = [("serving_default", {})]
    given = {"beam_size": args.beam_size, "alpha": args.alpha,
             "extra_length": args.extra_length}
    if any(value is not None for value in given.values()):
        requests.append(("translate_with_options",
                         {key: PAPER_OPTIONS[key] if value is None else value
                          for key, value in given.items()}))
    for signature, options in requests:
        request = build_request(args.model, args.sentences, signature, **options)
        texts, scores = translations(stub.Predict(request, args.timeout))
        print(" ".join([signature] + [f"{k}={v}" for k, v in options.items()]))
        for source, translation, score in zip(args.sentences, texts, scores):
            print(f"  {source!r} -> {translation!r}  score {score:.4f}")


if __name__ == "__main__":
    main()
