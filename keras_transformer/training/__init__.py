"""Training at scale (paper section 5), TensorFlow-only:

- `strategy`: choosing the `tf.distribute` strategy and the mixed-precision policy;
- `checkpoints`: step checkpoints that resume exactly, and checkpoint averaging;
- `callbacks`: stopping at a step, TensorBoard scalars, throughput, the
  evaluation hook (`TranslationEvaluation(translate_fn, ...)`).

The `kt-train` command over them is `keras_transformer/cli/train.py`.
"""
