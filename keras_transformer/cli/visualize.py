"""Pictures of a trained model: attention maps of one translated sentence
(encoder self-attention, decoder self-attention, encoder-decoder attention;
every layer and head, tokens on the axes) and the positional encoding.

    kt-visualize --run-dir runs/demo --sentence "the dog sees a cat" \\
        --output-dir runs/demo/pictures
"""

import argparse
import os
import sys

from keras_transformer import startup


def visualize(run_dir, sentence, output_dir, checkpoint=None, beam_size=None, alpha=None):
    """Translates `sentence` with the run's model and writes the PNGs;
    `beam_size` and `alpha` None are the paper's (`decoding.DEFAULT_*`).

    Returns: `(translation, {name: path})`.

    Raises: `keras_transformer.visualization.MatplotlibMissing` (before
    reading the run) when matplotlib, of the `viz` extra, is not installed.
    """
    import numpy as np
    import tensorflow as tf

    from keras_transformer.decoding import DEFAULT_ALPHA, DEFAULT_BEAM_SIZE, beam_search_translate
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.training.checkpoints import averaged_if_asked
    from keras_transformer.visualization import (
        plot_positional_encoding,
        plot_translation_attention,
        require_matplotlib,
    )

    require_matplotlib()  # before the run is loaded and the sentence decoded
    run = RunDirectory(run_dir)
    source_tokenizer, tokenizer = run.load_tokenizers()
    model = run.load_model(averaged_if_asked(run, checkpoint))
    source = source_tokenizer.tokenize(tf.constant([sentence])).to_list()[0]
    if not source:
        raise ValueError("The sentence is empty after tokenization; nothing to visualise.")
    source_ids = np.array([source[: model.config.max_length - 1] + [source_tokenizer.eos_id]],
                          "int32")
    sequences, _ = beam_search_translate(
        model, source_ids, beam_size=DEFAULT_BEAM_SIZE if beam_size is None else beam_size,
        alpha=DEFAULT_ALPHA if alpha is None else alpha)
    output = []
    for token in np.asarray(sequences)[0, 0].tolist():
        output.append(token)
        if token == tokenizer.eos_id:
            break
    target_ids = np.array([[tokenizer.bos_id] + output[:-1]], "int32")
    def pieces(vocabulary, ids):
        return [p.decode("utf-8") for p in vocabulary.id_to_piece(ids).numpy()]

    paths = plot_translation_attention(
        model, pieces(source_tokenizer, source_ids[0]), source_ids,
        pieces(tokenizer, target_ids[0]), target_ids,
        output_dir,
    )
    paths["positional_encoding"] = plot_positional_encoding(
        64, model.config.d_model, os.path.join(output_dir, "positional_encoding.png")
    )
    translation = tokenizer.detokenize(np.array([output], "int32")).numpy()[0].decode("utf-8")
    return translation, paths


def build_parser():
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="kt-visualize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a training run directory")
    parser.add_argument("--sentence", required=True, help="source sentence to translate")
    parser.add_argument("--output-dir", help="where to write PNGs (default <run-dir>/pictures)")
    parser.add_argument("--checkpoint", help="auto (default: averaged/ unless stale, else "
                        "best/, else the latest), last, best, averaged, best:K or last:K "
                        "(average the best/last K now), or a checkpoint prefix")
    parser.add_argument("--beam-size", type=int, help="default: the paper's, 4")
    parser.add_argument("--alpha", type=float, help="length penalty; default: the paper's, 0.6")
    startup.add_arguments(parser)
    return parser


def main(argv=None):
    """kt-visualize. Returns 0, or 2 after a one-line `error:` on stderr (a
    missing run, checkpoint or sentence, or no matplotlib: the `viz` extra)."""
    startup.start(argv)
    args = build_parser().parse_args(argv)
    from keras_transformer.visualization import MatplotlibMissing

    output_dir = args.output_dir or os.path.join(args.run_dir, "pictures")
    try:
        translation, paths = visualize(args.run_dir, args.sentence, output_dir,
                                       args.checkpoint, args.beam_size, args.alpha)
    except (ValueError, FileNotFoundError, MatplotlibMissing) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"source:      {args.sentence}\ntranslation: {translation}")
    for name, path in paths.items():
        print(f"{name:20s} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
