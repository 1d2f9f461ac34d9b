"""TF Serving's gRPC API on kt-serve (`--port`): `PredictionService`
(Predict, GetModelMetadata) and `ModelService` (GetModelStatus), with TF
Serving's protos from `tensorflow-serving-api` (the `grpc` extra), so TF
Serving's gRPC clients, and the package's `GrpcClient`, work unchanged.

A Predict runs through the REST server's `ServingApp.run_predict` on its
event loop: the same limits, queues, batching, deadline and metrics
(entrypoint "GRPC"). Errors are TF Serving's canonical codes: the REST
answer's HTTP status maps back to its code (400 INVALID_ARGUMENT, 404
NOT_FOUND, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED). HandleReloadConfigRequest
and the health service are `grpc_admin`'s; Classify, Regress and
MultiInference answer UNIMPLEMENTED.
"""

import asyncio
import concurrent.futures
import logging
import os
import time

from keras_transformer.serving import grpc_admin
from keras_transformer.serving.rest_api import DEFAULT_SIGNATURE, RestError, tf_type_name

LOGGER = logging.getLogger("kt-serve")
_STATES = ("UNKNOWN", "START", "LOADING", "AVAILABLE", "UNLOADING", "END")


def _imports():
    try:
        import grpc
        import tensorflow as tf
        from tensorflow_serving.apis import (
            get_model_metadata_pb2,
            get_model_status_pb2,
            model_service_pb2_grpc,
            predict_pb2,
            prediction_service_pb2_grpc,
        )
    except ImportError:
        raise ImportError("kt-serve --port (gRPC) needs grpcio and TF Serving's protos: pip "
                          "install 'attention-transformer-keras[grpc]'") from None
    return (grpc, tf, get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
            predict_pb2, prediction_service_pb2_grpc)


def _model_spec(spec):
    """(name, version or None, label or None) of a `ModelSpec`."""
    version = spec.version.value if spec.HasField("version") else None
    return spec.name, version, spec.version_label or None


def _code(grpc, status):
    from keras_transformer.serving.app import status_code_name

    return getattr(grpc.StatusCode, status_code_name(status))


def signature_defs(servable):
    """The `SignatureDef`s of a servable's SavedModel, read from its
    `saved_model.pb` (cached on the servable)."""
    cached = getattr(servable, "_signature_defs", None)
    if cached is None:
        path = os.path.join(servable.path, "saved_model.pb")
        if os.path.isfile(path):
            from tensorflow.core.protobuf import saved_model_pb2

            saved_model = saved_model_pb2.SavedModel()
            with open(path, "rb") as f:
                saved_model.ParseFromString(f.read())
            cached = saved_model.meta_graphs[0].signature_def
        else:  # another engine: described by its specs
            cached = _signature_defs_of(servable.specs)
        servable._signature_defs = cached
    return cached


def _signature_defs_of(specs):
    """`{name: SignatureDef}` describing `rest_api.SignatureSpec`s."""
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    from keras_transformer.serving.model_versions import tf_dtype
    from keras_transformer.serving.rest_api import PREDICT_METHOD

    def info(name, spec, proto):
        proto.name = name
        proto.dtype = tf_dtype(tf, spec).as_datatype_enum
        for size in spec.shape:
            proto.tensor_shape.dim.add().size = -1 if size is None else size

    definitions = {}
    for signature, spec in specs.items():
        definition = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
        for name, tensor in spec.inputs.items():
            info(name, tensor, definition.inputs[name])
        for name, tensor in spec.outputs.items():
            info(name, tensor, definition.outputs[name])
        definitions[signature] = definition
    return definitions


# The TensorProto field that carries each dtype's values when
# `tensor_content` is empty.
_VALUE_FIELDS = {"string": "string_val", "float32": "float_val", "float64": "double_val",
                 "float16": "half_val", "bfloat16": "half_val", "int8": "int_val",
                 "int16": "int_val", "int32": "int_val", "uint8": "int_val",
                 "uint16": "int_val", "int64": "int64_val", "uint32": "uint32_val",
                 "uint64": "uint64_val", "bool": "bool_val"}


def tensor_from_proto(tf, proto, spec, where, max_rows):
    """The `np.ndarray` of a request's `TensorProto`, checked against its
    `rest_api.TensorSpec` from what the proto declares before any value is
    materialised, so a few bytes on the wire cannot declare a huge tensor.

    Checks, in order: a dtype is set and is the spec's; the shape has the
    spec's rank, no negative or unknown dimension, the spec's fixed sizes,
    and at most `max_rows` along each dimension the spec leaves open; the
    values carried match the element count (`tensor_content` of exactly
    count x itemsize bytes, or count values, or one value that fills the
    shape, as `tf.make_ndarray` reads it).

    Raises: `RestError` (400, INVALID_ARGUMENT) naming `where` and what is
    wrong.
    """
    if proto.dtype == 0:
        raise RestError(f"{where} has no dtype (DT_INVALID); it must be "
                        f"{tf_type_name(spec.dtype)}.")
    try:
        got = tf.dtypes.as_dtype(proto.dtype).name
    except (TypeError, ValueError):
        raise RestError(f"{where} has an unknown dtype enum value {proto.dtype}.") from None
    if got != spec.dtype:
        raise RestError(f"{where} must be {spec.dtype}, received {got}.")
    if proto.tensor_shape.unknown_rank:
        raise RestError(f"{where} must have shape {_shape_list(spec.shape)}, received an "
                        "unknown rank.")
    dims = [d.size for d in proto.tensor_shape.dim]
    if len(dims) != len(spec.shape) or any(
            size < 0 or (want is not None and size != want) or (want is None and size > max_rows)
            for size, want in zip(dims, spec.shape)):
        raise RestError(f"{where} must have shape {_shape_list(spec.shape)} with at most "
                        f"{max_rows} along an open dimension (--max-request-sentences), "
                        f"received {dims}.")
    count = 1
    for size in dims:
        count *= size
    if proto.tensor_content and spec.dtype != "string":
        itemsize = tf.dtypes.as_dtype(proto.dtype).size
        if len(proto.tensor_content) != count * itemsize:
            raise RestError(f"{where} declares shape {dims} ({count} values of {itemsize} "
                            f"bytes) but carries {len(proto.tensor_content)} bytes of "
                            "tensor_content.")
    else:
        carried = len(getattr(proto, _VALUE_FIELDS.get(spec.dtype, "string_val")))
        if carried != count and not (carried == 1 and count > 1):
            raise RestError(f"{where} declares shape {dims} ({count} values) but carries "
                            f"{carried} values.")
    try:
        return tf.make_ndarray(proto)
    except Exception as e:  # a malformed TensorProto is the client's fault
        raise RestError(f"{where} is not a valid TensorProto: {e}") from None


def _shape_list(shape):
    return [-1 if size is None else size for size in shape]


class GrpcServices:
    """The servicers' logic over a `ServingApp` whose coroutines run on
    `loop`."""

    def __init__(self, serving_app, loop):
        (self.grpc, self.tf, self.metadata_pb2, self.status_pb2, _, self.predict_pb2,
         _) = _imports()
        self.app = serving_app
        self.loop = loop

    def _on_loop(self, coroutine, context):
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        context.add_callback(future.cancel)  # the client went away or its deadline passed
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            context.abort(self.grpc.StatusCode.CANCELLED, "The request was cancelled.")

    def predict(self, request, context):
        start = time.monotonic()
        name = request.model_spec.name
        status = 500
        try:
            response = self._on_loop(self._predict(request, start), context)
            status = 200
            return response
        except RestError as e:
            status = e.status
            context.abort(_code(self.grpc, e.status), e.message)
        finally:
            from keras_transformer.serving.app import status_code_name

            self.app.metrics.observe_request(self.app.metrics_model_name(name),
                                             status_code_name(status),
                                             (time.monotonic() - start) * 1e6, "GRPC")

    async def _predict(self, request, start):
        tf = self.tf
        name, version, label = _model_spec(request.model_spec)
        servable = self.app.servable(name, version, label)
        signature = request.model_spec.signature_name or DEFAULT_SIGNATURE
        spec = servable.specs.get(signature)
        if spec is None:
            raise RestError(f"Serving signature name: \"{signature}\" not found in signature "
                            f"def (signatures: {', '.join(sorted(servable.specs))}).")
        given, expected = set(request.inputs), set(spec.inputs)
        if given != expected:
            missing, extra = sorted(expected - given), sorted(given - expected)
            raise RestError(f"Signature '{signature}' takes inputs {sorted(expected)}; the "
                            f"request is missing {missing} and has extra {extra}.")
        inputs = {key: tensor_from_proto(tf, proto, spec.inputs[key],
                                         f"Input '{key}' of signature '{signature}'",
                                         self.app.request_limits.max_request_sentences)
                  for key, proto in request.inputs.items()}
        outputs = await self.app.run_predict(servable, name, signature, inputs, start)
        response = self.predict_pb2.PredictResponse()
        response.model_spec.name = name
        response.model_spec.version.value = servable.version
        response.model_spec.signature_name = signature
        wanted = set(request.output_filter) or set(outputs)
        unknown = wanted - set(outputs)
        if unknown:
            raise RestError(f"output_filter names {sorted(unknown)}, which signature "
                            f"'{signature}' does not output ({sorted(outputs)}).")
        for key in sorted(wanted):
            response.outputs[key].CopyFrom(tf.make_tensor_proto(outputs[key]))
        return response

    def get_model_metadata(self, request, context):
        name, version, label = _model_spec(request.model_spec)
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            context.abort(self.grpc.StatusCode.INVALID_ARGUMENT,
                          f"Metadata field(s) {fields} not supported; ask for "
                          "['signature_def'].")
        try:
            servable = self.app.servable(name, version, label)
        except RestError as e:
            context.abort(_code(self.grpc, e.status), e.message)
        response = self.metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = name
        response.model_spec.version.value = servable.version
        definitions = self.metadata_pb2.SignatureDefMap()
        for key, value in signature_defs(servable).items():
            definitions.signature_def[key].CopyFrom(value)
        response.metadata["signature_def"].Pack(definitions)
        return response

    def get_model_status(self, request, context):
        name, version, label = _model_spec(request.model_spec)
        try:
            if label is not None:
                version = self.app.label_version(name, label)
            entries = self.app.status_entries(name, version)
        except RestError as e:
            context.abort(_code(self.grpc, e.status), e.message)
        response = self.status_pb2.GetModelStatusResponse()
        for number, state, error in entries:
            status = response.model_version_status.add()
            status.version = number
            status.state = _STATES.index(state) * 10 if state in _STATES else 0
            status.status.error_code = 2 if error else 0  # UNKNOWN or OK
            status.status.error_message = error
        return response


def start_grpc_server(serving_app, loop, host, port, max_workers=16, credentials=None,
                      config_watcher=None, health=False):
    """Starts the gRPC services of `serving_app` on `host:port` (0: a free
    port): over TLS with `credentials` (`grpc.ServerCredentials`), else
    in the clear; HandleReloadConfigRequest through `config_watcher` (a
    `models.ModelConfigWatcher`; None: it answers FAILED_PRECONDITION);
    with `health`, the gRPC health service (`grpc_admin`).

    Returns: `(server, port)`; stop it with `server.stop(grace)`.
    Raises: `ImportError` without the `grpc` extra; `ValueError` when the
    address cannot be bound.
    """
    (grpc, _, _, _, model_service_pb2_grpc, _, prediction_service_pb2_grpc) = _imports()
    services = GrpcServices(serving_app, loop)

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):  # noqa: N802  (the proto's name)
            return services.predict(request, context)

        def GetModelMetadata(self, request, context):  # noqa: N802
            return services.get_model_metadata(request, context)

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        def GetModelStatus(self, request, context):  # noqa: N802
            return services.get_model_status(request, context)

        def HandleReloadConfigRequest(self, request, context):  # noqa: N802
            return grpc_admin.reload_config(config_watcher, request, context, grpc)

    limit = serving_app.max_request_bytes
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="kt-serve-grpc"),
        maximum_concurrent_rpcs=serving_app.max_concurrent_requests,
        options=[("grpc.max_receive_message_length", limit),
                 ("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(), server)
    follow_health = grpc_admin.add_health_service(server, serving_app.models) if health \
        else None
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = (server.add_insecure_port(address) if credentials is None
                 else server.add_secure_port(address, credentials))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise ValueError(f"Cannot listen for gRPC on {address}.")
    server.start()
    if follow_health is not None:
        follow_health()
    return server, bound
