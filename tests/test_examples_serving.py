"""The serving examples work as their files say: examples/saved_model_predict.py
(plain TensorFlow, no keras_transformer) calls every signature of a tiny
export and prints what the package's own `SavedModelTranslator` gets;
examples/tf_serving/rest_client.py translates through kt-serve (TF Serving's
REST API); grpc_client.py builds requests of the signatures' dtypes and
translates through kt-serve's gRPC PredictionService (`--port`); models.config and batching_parameters.txt parse as TF Serving's
text protobufs, and the docs give the one `docker run` line of the README."""

import ast
import concurrent.futures
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from support.processes import ENV, ROOT
from support.serving_model import export_tiny_model, start_server, stop_server

from keras_transformer.export.saved_model import SavedModelTranslator

EXAMPLES = os.path.join(ROOT, "examples")
PREDICT = os.path.join(EXAMPLES, "saved_model_predict.py")
TF_SERVING = os.path.join(EXAMPLES, "tf_serving")
NAME = "tiny"
SENTENCES = ["A man rides his bike across the bridge.", "Die Mädchen.", ""]
SEARCH = {"beam_size": 2, "alpha": 0.0, "extra_length": 3}
SAMPLING = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 5}
SOURCE_IDS = [17, 25, 9]
TF_SERVING_API = "tensorflow-serving-api (pip install 'tensorflow-serving-api==2.21.*')"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The tiny model as versions 9 and 10 of `<base>` (numerically, not
    alphabetically, 10 is the newest), kt-serve serving it, and the
    package's `SavedModelTranslator` of version 10."""
    base = tmp_path_factory.mktemp("examples") / "saved_models" / NAME
    nine = export_tiny_model(base.parent, name=NAME, version=9)
    newest = str(base / "10")
    shutil.copytree(nine, newest)
    # The server starts on a thread while this process loads the model.
    starting = concurrent.futures.ThreadPoolExecutor(1).submit(
        start_server, ["--model-name", NAME, "--model-base-path", str(base)]
        + (["--port", "0"] if importlib.util.find_spec("tensorflow_serving") else []))
    try:
        translator = SavedModelTranslator(newest)
    except BaseException:
        stop_server(starting.result()[0])
        raise
    process, url = starting.result()
    try:
        yield {"base": str(base), "newest": newest, "translator": translator, "url": url,
               "grpc": getattr(process, "grpc_target", None)}
    finally:
        stop_server(process)


def run(argv, cwd, timeout=300):
    """Runs `python argv...` in `cwd`; returns the finished process."""
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def sections(stdout):
    """An example's output as `{first word of a header: (header, lines)}`:
    a header is an unindented line, its lines the indented ones after it."""
    found = {}
    for line in stdout.splitlines():
        if line and not line[0].isspace():
            lines = []
            found[line.split()[0]] = (line, lines)
        elif line:
            lines.append(line)
    return found


def parse_translation(line, source, indent="  "):
    """`(translation, score)` of a line `<indent>'source' -> 'translation'  score S`."""
    prefix = f"{indent}{source!r} -> "
    assert line.startswith(prefix), (line, prefix)
    translation, score = line[len(prefix):].rsplit("  score ", 1)
    return ast.literal_eval(translation), float(score)


def assert_translations(lines, translations, scores):
    assert len(lines) == len(SENTENCES)
    for line, source, translation, score in zip(lines, SENTENCES, translations, scores):
        got, got_score = parse_translation(line, source)
        assert got == translation
        assert got_score == pytest.approx(score, abs=2e-4)


def load_module(path):
    """An example file as a module, without running its `main`."""
    spec = importlib.util.spec_from_file_location(
        "example_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# examples/saved_model_predict.py ---------------------------------------------


def test_saved_model_predict_imports_only_tensorflow_and_tensorflow_text():
    with open(PREDICT, encoding="utf-8") as f:
        source = f.read()
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module.split(".")[0])
    assert modules == {"argparse", "json", "os", "sys", "tensorflow", "tensorflow_text"}
    assert "keras_transformer" not in source.replace("no keras_transformer", "")
    # The import says why it is there.
    assert re.search(r'^import tensorflow_text  # noqa: F401  \(its SentencePiece ops: '
                     r'"Op type not registered" without\)$', source, re.M)


@pytest.mark.e2e
def test_saved_model_predict_calls_every_signature(exported, tmp_path):
    translator = exported["translator"]
    # The example runs while this process computes the expected answers.
    example = subprocess.Popen(
        [sys.executable, PREDICT, exported["base"], *SENTENCES,
         "--beam-size", "2", "--alpha", "0", "--extra-length", "3", "--n", "2",
         "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "5",
         "--source-ids", " ".join(map(str, SOURCE_IDS))],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expected = {
            "serving_default": translator.translate(SENTENCES),
            "translate_xla": translator.translate(SENTENCES, jit_compile=True),
            "translate_with_options": translator.translate(SENTENCES, **SEARCH),
            "translate_sample": translator.sample(SENTENCES, extra_length=3, **SAMPLING),
            "translate_nbest": translator.translate_nbest(SENTENCES, 2, **SEARCH),
            "translate_explain": translator.explain(SENTENCES, **SEARCH),
            "translate_ids": translator.loaded.signatures["translate_ids"](
                source_ids=tf.constant([SOURCE_IDS], tf.int32)),
        }
        stdout, stderr = example.communicate(timeout=300)
    finally:
        if example.poll() is None:
            example.kill()
            example.wait()
    assert example.returncode == 0, stderr[-4000:]
    out = sections(stdout)

    newest = exported["newest"]
    assert out[newest + ":"][0] == f"{newest}: exported by TensorFlow {tf.__version__}"
    signatures = sorted(translator.loaded.signatures)
    assert len(signatures) == 7
    assert out["signatures:"][0] == "signatures: " + ", ".join(signatures)
    assert out["export's"][0] == "export's options: beam_size=3 alpha=0.6 extra_length=4"
    assert set(out) - {newest + ":", "signatures:", "export's"} == set(signatures)

    assert_translations(out["serving_default"][1], *expected["serving_default"])
    assert_translations(out["translate_xla"][1], *expected["translate_xla"])
    assert out["translate_with_options"][0] == (
        "translate_with_options beam_size=2 alpha=0 extra_length=3")
    assert_translations(out["translate_with_options"][1], *expected["translate_with_options"])
    assert out["translate_sample"][0] == (
        "translate_sample temperature=0.8 top_k=20 top_p=0.9 seed=5 extra_length=3")
    assert_translations(out["translate_sample"][1], *expected["translate_sample"])

    lines = iter(out["translate_nbest"][1])
    for source, best in zip(SENTENCES, expected["translate_nbest"]):
        assert next(lines) == f"  {source!r}"
        for rank, (translation, score) in enumerate(best, 1):
            got, got_score = next_ranked(lines, rank)
            assert (got, got_score) == (translation, pytest.approx(score, abs=2e-4))
    assert next(lines, None) is None

    lines = iter(out["translate_explain"][1])
    for source, explained in zip(SENTENCES, expected["translate_explain"]):
        translation, score = parse_translation(next(lines), source)
        assert translation == explained["translation"]
        assert score == pytest.approx(explained["score"], abs=2e-4)
        for piece, log_p, weights in zip(explained["target_pieces"],
                                         explained["token_log_probs"],
                                         explained["alignment"]):
            match = re.fullmatch(r"    (.+)  log p (\S+)  attends most to (.+)", next(lines))
            assert ast.literal_eval(match[1]) == piece
            assert float(match[2]) == pytest.approx(log_p, abs=2e-4)
            assert ast.literal_eval(match[3]) == explained["source_pieces"][
                int(np.argmax(weights))]
    assert next(lines, None) is None

    ids = expected["translate_ids"]
    pad = translator.metadata["config"]["pad_id"]
    want = [int(i) for i in ids["translation_ids"][0].numpy()]
    while want and want[-1] == pad:
        want.pop()
    (line,) = out["translate_ids"][1]
    match = re.fullmatch(r"  (\[.*\]) -> (\[.*\])  score (\S+)", line)
    assert ast.literal_eval(match[1]) == SOURCE_IDS
    assert want and ast.literal_eval(match[2]) == want
    assert float(match[3]) == pytest.approx(float(ids["score"][0]), abs=2e-4)


def next_ranked(lines, rank):
    """`(translation, score)` of the next n-best line, `    <rank>. 'text'  score S`."""
    line = next(lines)
    prefix = f"    {rank}. "
    assert line.startswith(prefix), line
    translation, score = line[len(prefix):].rsplit("  score ", 1)
    return ast.literal_eval(translation), float(score)


@pytest.mark.e2e
def test_plain_tensorflow_needs_tensorflow_text_and_the_version_directory(exported,
                                                                          tmp_path):
    # What the docs say goes wrong without the example's two steps.
    script = (
        "import sys, tensorflow as tf\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        tf.saved_model.load(path)\n"
        "        print('loaded')\n"
        "    except Exception as error:\n"
        "        print(type(error).__name__, str(error).replace('\\n', ' ')[:300])\n")
    done = run(["-c", script, exported["base"], exported["newest"]], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    base, version = done.stdout.strip().splitlines()
    assert base.startswith("OSError") and "SavedModel file does not exist" in base, base
    assert "Op type not registered" in version, version


# examples/tf_serving/rest_client.py ------------------------------------------


@pytest.mark.e2e
def test_rest_client_translates_through_kt_serve(exported, tmp_path):
    translator = exported["translator"]
    done = run([os.path.join(TF_SERVING, "rest_client.py"), "--url", exported["url"],
                "--model", NAME, "--beam-size", "2", "--alpha", "0", "--extra-length", "3",
                *SENTENCES], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = sections(done.stdout)
    assert set(out) == {"serving_default", "translate_with_options"}
    assert out["serving_default"][0] == "serving_default"
    assert_translations(out["serving_default"][1], *translator.translate(SENTENCES))
    assert out["translate_with_options"][0] == (
        "translate_with_options beam_size=2 alpha=0.0 extra_length=3")
    assert_translations(out["translate_with_options"][1],
                        *translator.translate(SENTENCES, **SEARCH))


@pytest.mark.e2e
def test_rest_client_reports_the_servers_error(exported, tmp_path):
    done = run([os.path.join(TF_SERVING, "rest_client.py"), "--url", exported["url"],
                "--model", "absent", "Ein Hund."], cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip() == ("serving_default: the server answered 404: Servable not "
                                   "found for request: Latest(absent)")


# examples/tf_serving/grpc_client.py ------------------------------------------


@pytest.fixture(scope="module")
def grpc_client():
    pytest.importorskip("tensorflow_serving.apis.predict_pb2",
                        reason=f"the gRPC client needs {TF_SERVING_API}")
    return load_module(os.path.join(TF_SERVING, "grpc_client.py"))


@pytest.mark.e2e
def test_grpc_requests_carry_the_signatures_dtypes(grpc_client, exported):
    from tensorflow_serving.apis import predict_pb2

    request = grpc_client.build_request(NAME, SENTENCES, "translate_sample", version=10,
                                        extra_length=3, **SAMPLING)
    assert isinstance(request, predict_pb2.PredictRequest)
    assert (request.model_spec.name, request.model_spec.signature_name,
            request.model_spec.version.value) == (NAME, "translate_sample", 10)
    text = request.inputs["text"]
    assert tf.dtypes.as_dtype(text.dtype) == tf.string
    assert [d.size for d in text.tensor_shape.dim] == [len(SENTENCES)]
    assert list(text.string_val) == [s.encode("utf-8") for s in SENTENCES]
    # Each scalar input has its signature's dtype and holds its value.
    signatures = exported["translator"].loaded.signatures
    specs = signatures["translate_sample"].structured_input_signature[1]
    assert set(request.inputs) == set(specs)
    for name, proto in request.inputs.items():
        assert tf.dtypes.as_dtype(proto.dtype) == specs[name].dtype, name
        if name != "text":
            assert proto.tensor_shape.dim == [], name
            value = tf.make_ndarray(proto)
            assert value == pytest.approx({**SAMPLING, "extra_length": 3}[name]), name
    # The client's dtype table is the export's, for every signature's scalars.
    for name, signature in signatures.items():
        for key, spec in signature.structured_input_signature[1].items():
            if spec.shape.rank == 0:
                assert grpc_client.OPTION_DTYPES[key] == spec.dtype, (name, key)

    default = grpc_client.build_request(NAME, ["Ein Hund."])
    assert default.model_spec.signature_name == "serving_default"
    assert not default.model_spec.HasField("version")
    assert set(default.inputs) == {"text"}
    with pytest.raises(ValueError, match="beam"):
        grpc_client.build_request(NAME, ["Ein Hund."], "translate_with_options", beam=4)


@pytest.mark.e2e
def test_grpc_client_translates_through_kt_serve_s_grpc_api(grpc_client, exported, capsys):
    pytest.importorskip("tensorflow_serving", reason=TF_SERVING_API)
    grpc_client.main(["--target", exported["grpc"], "--model", NAME,
                      "--beam-size", "2", "--alpha", "0", "--extra-length", "3",
                      *SENTENCES])
    out = sections(capsys.readouterr().out)
    assert set(out) == {"serving_default", "translate_with_options"}
    translator = exported["translator"]
    assert_translations(out["serving_default"][1], *translator.translate(SENTENCES))
    assert out["translate_with_options"][0] == (
        "translate_with_options beam_size=2 alpha=0.0 extra_length=3")
    assert_translations(out["translate_with_options"][1],
                        *translator.translate(SENTENCES, **SEARCH))


# The server's files and the docker line ---------------------------------------


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def docker_lines(path):
    """The `docker run` commands of a Markdown file, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", read(path), re.S)
    commands = [" ".join(block.replace("\\\n", " ").split()) for block in blocks]
    return [c for c in commands if c.startswith("docker run")]


def test_one_pinned_docker_line_in_the_readme_and_the_docs():
    (line,) = docker_lines(os.path.join(TF_SERVING, "README.md"))
    assert docker_lines(os.path.join(ROOT, "docs", "serving.md")) == [line]
    assert docker_lines(os.path.join(ROOT, "docs", "decoding-and-serving.md")) == []
    image = re.search(r"tensorflow/serving:(\S+)", line)[1]
    # The release of the TensorFlow the package exports with.
    assert image.split(".")[:2] == tf.__version__.split(".")[:2]
    assert "-p 8500:8500" in line and "-p 8501:8501" in line
    mounts = dict(m[::-1] for m in re.findall(
        r"--mount type=bind,source=\"\$PWD/([^\"]+)\",target=(\S+?),readonly", line))
    assert mounts == {"/models": "saved_models", "/config": "examples/tf_serving"}
    flags = dict(re.findall(r"--(\w+)=(\S+)", line))
    assert "--enable_batching" in line.split()
    for flag, name in (("model_config_file", "models.config"),
                       ("batching_parameters_file", "batching_parameters.txt")):
        assert flags[flag] == f"/config/{name}"
        assert os.path.isfile(os.path.join(TF_SERVING, name))


def test_models_config_is_a_model_server_config():
    model_server_config_pb2 = pytest.importorskip(
        "tensorflow_serving.config.model_server_config_pb2",
        reason=f"TF Serving's config protos come with {TF_SERVING_API}")
    from google.protobuf import text_format

    config = text_format.Parse(read(os.path.join(TF_SERVING, "models.config")),
                               model_server_config_pb2.ModelServerConfig())
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == (
        "demo", "/models/demo", "tensorflow")


def batching_parameters_class():
    """TF Serving's `BatchingParameters` message class: from
    tensorflow_serving when it has it (tensorflow-serving-api ships only
    the APIs and config protos), else built from the fields of
    tensorflow_serving/servables/tensorflow/session_bundle_config.proto."""
    try:
        from tensorflow_serving.servables.tensorflow.session_bundle_config_pb2 import (
            BatchingParameters,
        )
        return BatchingParameters
    except ImportError:
        pass
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    fields = [("max_batch_size", 1, "Int64Value"), ("batch_timeout_micros", 2, "Int64Value"),
              ("max_enqueued_batches", 3, "Int64Value"), ("num_batch_threads", 4, "Int64Value"),
              ("thread_pool_name", 5, "StringValue"), ("allowed_batch_sizes", 6, None),
              ("pad_variable_length_inputs", 7, "bool"),
              ("enable_large_batch_splitting", 8, "BoolValue"),
              ("max_execution_batch_size", 9, "Int64Value")]
    types = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="session_bundle_config_batching.proto", package="tensorflow.serving",
        syntax="proto3", dependency=["google/protobuf/wrappers.proto"])
    message = file.message_type.add(name="BatchingParameters")
    for name, number, kind in fields:
        field = message.field.add(name=name, number=number, label=types.LABEL_OPTIONAL)
        if kind is None:
            field.type, field.label = types.TYPE_INT64, types.LABEL_REPEATED
        elif kind == "bool":
            field.type = types.TYPE_BOOL
        else:
            field.type, field.type_name = types.TYPE_MESSAGE, f".google.protobuf.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


def test_batching_parameters_are_kt_serves_defaults():
    from google.protobuf import text_format

    from keras_transformer.cli.serve import build_parser

    parameters = text_format.Parse(
        read(os.path.join(TF_SERVING, "batching_parameters.txt")), batching_parameters_class()())
    defaults = build_parser().parse_args(["--model-name", NAME])
    values = {field.name: value.value for field, value in parameters.ListFields()}
    assert values == {name: getattr(defaults, name) for name in (
        "max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
        "num_batch_threads")}
