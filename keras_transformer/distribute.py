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


def first_replica_batch(epoch_iterator):
    """The first replica's part of the next batch of a Keras epoch iterator
    over a `tf.distribute` dataset, or None when the batch is not
    distributed (or the backend is not TensorFlow). Used to build a model
    symbolically when replicas hold batches of different shapes."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    for _, _, iterator in epoch_iterator:
        batch = next(iterator)
        break
    else:
        return None
    leaves = tf.nest.flatten(batch)
    if not leaves or not all(isinstance(x, tf.distribute.DistributedValues) for x in leaves):
        return None
    strategy = tf.distribute.get_strategy()
    if not tf.distribute.has_strategy():
        return tf.nest.map_structure(lambda x: x.values[0], batch)
    return tf.nest.map_structure(lambda x: strategy.experimental_local_results(x)[0], batch)


def multi_worker_safe_logs(logs):
    """Keras 3.15 on TF reduces the step's logs with
    `strategy.reduce("MEAN", value, axis=0)` under multi-worker
    `MultiWorkerMirroredStrategy`, which fails on scalars; give each scalar a
    batch axis of 1 there (the mean of the replicas' equal values is the
    value). Elsewhere `logs` is returned unchanged: on other backends it is
    whatever their `train_step` returns (JAX: `(logs, state)`)."""
    if keras.backend.backend() != "tensorflow":
        return logs
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode())
    if not multi_worker:
        return logs
    return {k: tf.reshape(v, [1]) if getattr(v, "shape", None) is not None and v.shape.rank == 0
            else v for k, v in logs.items()}
