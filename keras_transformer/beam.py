"""Translating corpora on Apache Beam: text files by glob in, the
SavedModel through Beam's RunInference (one model per worker, batches that
Beam sizes), and per input file sharded outputs in input order.

    python -m keras_transformer.beam --saved-model saved_models/de_en \\
        --input 'crawl/*.de' --output-dir translated/ \\
        --runner DirectRunner --direct_num_workers 2 \\
        --direct_running_mode multi_processing

Each input file `NAME` gives `OUTPUT_DIR/NAME-SSSSS-of-NNNNN`, the shards
of `--shard-lines` lines (default 100,000) in order: their concatenation
is the file's translations, line i translating line i, as kt-translate
writes them (line breaks inside a translation become spaces). Every other
flag is Beam's pipeline option (`--runner DataflowRunner --project ...
--region ... --temp_location gs://...`, `--runner FlinkRunner
--flink_master ...`, `--runner SparkRunner --spark_master_url ...`:
docs/decoding-and-serving.md#apache-beam). Needs the `beam` extra
(`pip install 'attention-transformer-keras[beam]'`).
"""

import argparse
import os
import sys

DEFAULT_SHARD_LINES = 100_000


def _beam():
    try:
        import apache_beam
    except ImportError:
        raise ImportError("keras_transformer.beam needs Apache Beam: pip install "
                          "'attention-transformer-keras[beam]'") from None
    return apache_beam


def saved_model_handler(saved_model, min_batch_size=1, max_batch_size=64):
    """A Beam `ModelHandler` that translates strings with a SavedModel of
    this package: `load_model` loads it once per worker (its newest
    version when `saved_model` is a base path), `run_inference` calls its
    `serving_default` signature on a batch of sentences (str or bytes)
    and yields `PredictionResult(sentence, translation)` with the
    translation as str.

    Example:
    ```python
    handler = saved_model_handler("saved_models/de_en")
    with beam.Pipeline() as p:
        (p | beam.Create(["Ein Hund."]) | RunInference(handler)
           | beam.Map(lambda result: print(result.inference)))
    ```
    """
    from apache_beam.ml.inference.base import ModelHandler, PredictionResult

    class SavedModelHandler(ModelHandler):
        def load_model(self):
            import tensorflow as tf
            import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

            from keras_transformer.export.engine import SERVING_DEFAULT
            from keras_transformer.export.saved_model import resolve_version

            return tf.saved_model.load(
                resolve_version(saved_model)).signatures[SERVING_DEFAULT]

        def run_inference(self, batch, model, inference_args=None):
            import tensorflow as tf

            texts = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in batch]
            out = model(text=tf.constant(texts, tf.string))["translation"].numpy()
            return [PredictionResult(s, t.decode("utf-8", "replace"))
                    for s, t in zip(batch, out)]

        def batch_elements_kwargs(self):
            return {"min_batch_size": min_batch_size, "max_batch_size": max_batch_size}

        def get_metrics_namespace(self):
            return "keras_transformer"

    return SavedModelHandler()


def _lines(path):
    """The lines of `path` (local or any file system Beam knows, `.gz`
    decompressed) by kt-translate's rules (`streaming.split_lines`)."""
    from apache_beam.io.filesystems import FileSystems

    from keras_transformer.streaming import split_lines

    with FileSystems.open(path) as f:
        yield from split_lines(f)


def _numbered_lines(path):
    """`((path, line number), line)` for each line of `path`."""
    for number, line in enumerate(_lines(path)):
        yield (path, number), line


def _write(path, data):
    """`data` (bytes) to `path`: through a temporary name and a rename on
    a local disk, else through Beam's file system."""
    if "://" not in path:
        from keras_transformer.files import write_atomically

        write_atomically(path, data)
        return
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path) as f:
        f.write(data)


def _shard_name(output_dir, path, shard, shards):
    return os.path.join(output_dir, f"{os.path.basename(path)}-{shard:05d}-of-{shards:05d}")


def build_pipeline(pipeline, saved_model, pattern, output_dir,
                   shard_lines=DEFAULT_SHARD_LINES, max_batch_size=64):
    """Adds to `pipeline` the translation of every file matching `pattern`
    into `output_dir` (see the module docstring). Returns the PCollection
    of the shard paths written."""
    beam = _beam()
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference

    from keras_transformer.streaming import one_line

    def files(pattern):
        for match in FileSystems.match([pattern])[0].metadata_list:
            yield match.path

    def count(path):
        return path, sum(1 for _ in _lines(path))

    def write_shard(item, counts):
        (path, shard), numbered = item
        shards = max(1, -(-counts[path] // shard_lines))
        lines = [text for _, text in sorted(numbered)]
        target = _shard_name(output_dir, path, shard, shards)
        _write(target, "".join(one_line(t) + "\n" for t in lines).encode("utf-8"))
        return target

    paths = pipeline | "Files" >> beam.Create([pattern]) | "Match" >> beam.FlatMap(files)
    counts = paths | "Count" >> beam.Map(count)
    handler = KeyedModelHandler(saved_model_handler(saved_model, max_batch_size=max_batch_size))
    return (paths
            | "Lines" >> beam.FlatMap(_numbered_lines)
            | "Spread" >> beam.Reshuffle()
            | "Translate" >> RunInference(handler)
            | "ByShard" >> beam.Map(lambda kv: ((kv[0][0], kv[0][1] // shard_lines),
                                                (kv[0][1], kv[1].inference)))
            | "Group" >> beam.GroupByKey()
            | "Write" >> beam.Map(write_shard, counts=beam.pvalue.AsDict(counts)))


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.beam", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Other flags are Apache Beam's pipeline options.", allow_abbrev=False)
    parser.add_argument("--saved-model", required=True,
                        help="a SavedModel export of this package (a version directory or "
                        "its base path; on a cluster, a path every worker reads, e.g. gs://)")
    parser.add_argument("--input", required=True, help="a glob of text files, one sentence "
                        "per line")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--shard-lines", type=int, default=DEFAULT_SHARD_LINES)
    parser.add_argument("--max-batch-size", type=int, default=64,
                        help="the most sentences RunInference gives the model at once")
    args, beam_args = parser.parse_known_args(argv)
    if args.shard_lines < 1:
        parser.error("--shard-lines must be at least 1")
    beam = _beam()
    from apache_beam.options.pipeline_options import PipelineOptions

    if "://" not in args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        build_pipeline(pipeline, args.saved_model, args.input, args.output_dir,
                       args.shard_lines, args.max_batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
