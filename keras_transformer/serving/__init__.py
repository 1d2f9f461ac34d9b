"""kt-serve: TF Serving's REST API over an exported translator, for
development, demos and tests (TF Serving is the production server).

- `rest_api`: TF Serving's JSON request and response formats.
- `model_versions`: loads the newest version and swaps in newer ones.
- `batching`: merges concurrent requests into one model call.
- `app`: the Starlette application and its uvicorn server.
- `client`: `RestClient` and `GrpcClient`, the clients of kt-serve and of
  TF Serving (they need neither this server nor TensorFlow's serving
  binary).

The command line is `keras_transformer.cli.serve` (docs/serving.md).
"""
