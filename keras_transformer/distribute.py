"""What the loss needs from `tf.distribute`, kept out of the backend-neutral
layers: the number of replicas, and sums across them.

On JAX and PyTorch, Keras's distribution API shards one global batch inside a
single program, so local sums are already global and there is one "replica".
"""

import keras


def sum_over_replicas(value):
    """`(sum of value over the replicas in sync, number of replicas)`.

    Called inside a replica context (a `train_step`); outside `tf.distribute`
    it returns `(value, 1)`.
    """
    if keras.backend.backend() != "tensorflow":
        return value, 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value, 1
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stop_gradient(value))
    return total, context.num_replicas_in_sync
