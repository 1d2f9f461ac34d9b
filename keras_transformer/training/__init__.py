"""Training at scale (paper section 5), TensorFlow-only:

- `strategy`: choosing the `tf.distribute` strategy and the mixed-precision policy;
- `checkpoints`: step checkpoints that resume exactly, and checkpoint averaging;
- `callbacks`: stopping at a step or after a time, TensorBoard scalars,
  throughput;
- `selection`: validation BLEU (`ValidationBleu`), the best K validated
  checkpoints in `best/` and early stopping (`BestCheckpoints`);
- `moving_average`: validating the optimizer's exponential moving average
  of the weights (`ValidateMovingAverage`).

The `kt-train` command over them is `keras_transformer/cli/train.py`.
"""
