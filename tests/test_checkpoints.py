import json
import os
import stat

import numpy as np
import pytest
import tensorflow as tf

import keras
import keras_transformer as kt
from keras_transformer import files
from keras_transformer.run_directory import RunDirectory
from keras_transformer.training import callbacks as cb
from keras_transformer.training import checkpoints
from keras_transformer.training.checkpoints import (
    CheckpointWriter, StepCheckpoint, average_checkpoints, build_for_restore, optimizer_step)
from support.common import random_ids


def batch(seed):
    src = random_ids((4, 7), seed=seed)
    tgt = random_ids((4, 6), seed=seed + 1)
    tgt_in = np.concatenate([np.full((4, 1), 2, "int32"), tgt[:, :-1]], axis=1)
    return (src, tgt_in), tgt


def compiled(config, accumulation=None):
    model = kt.Transformer(config)
    optimizer = kt.transformer_adam(config.d_model, warmup_steps=10,
                                    gradient_accumulation_steps=accumulation)
    if accumulation:
        optimizer.learning_rate = cb.PerUpdateSchedule(optimizer._learning_rate, accumulation)
    model.compile(optimizer=optimizer,
                  loss=kt.LabelSmoothedCrossEntropy(0.1, pad_id=config.pad_id))
    build_for_restore(model, optimizer)
    return model, optimizer


def dataset(n, first_seed=0):
    batches = [batch(first_seed + 10 * i) for i in range(n)]
    return tf.data.Dataset.from_generator(
        lambda: iter(batches),
        output_signature=((tf.TensorSpec((4, 7), tf.int32), tf.TensorSpec((4, 6), tf.int32)),
                          tf.TensorSpec((4, 6), tf.int32)),
    # Known cardinality: on an exhausted dataset of unknown size, Keras 3.15's
    # fit advances `optimizer.iterations` once more than the batches it saw.
    ).apply(tf.data.experimental.assert_cardinality(n))


def values(variables):
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def test_resume_restores_weights_slots_and_step_exactly(tmp_path, tiny_config):
    model, optimizer = compiled(tiny_config)
    writer = CheckpointWriter(model, optimizer, str(tmp_path), max_to_keep=2)
    model.fit(dataset(5), epochs=1, verbose=0, shuffle=False,
              callbacks=[StepCheckpoint(writer, every_steps=2)])
    # Every 2 steps and at the end; the last 2 kept.
    assert [p.rsplit("/", 1)[1] for p in writer.manager.checkpoints] == ["ckpt-4", "ckpt-5"]

    fresh, fresh_optimizer = compiled(tiny_config)
    restored = CheckpointWriter(fresh, fresh_optimizer, str(tmp_path)).restore_latest()
    assert restored.endswith("ckpt-5") and optimizer_step(fresh_optimizer) == 5
    for a, b in zip(values(model.weights) + values(optimizer.variables),
                    values(fresh.weights) + values(fresh_optimizer.variables)):
        np.testing.assert_array_equal(a, b)
    schedule = kt.TransformerSchedule(tiny_config.d_model, 10)
    np.testing.assert_allclose(float(fresh_optimizer.learning_rate), float(schedule(5)), rtol=1e-6)
    # The next update is the same from the restored state (dropout off).
    for m in (model, fresh):
        m.fit(dataset(1, first_seed=99), epochs=1, verbose=0, shuffle=False)
    for a, b in zip(values(model.weights), values(fresh.weights)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_accumulation_counts_updates_and_schedule_per_update(tmp_path, tiny_config):
    model, optimizer = compiled(tiny_config, accumulation=2)
    model.fit(dataset(6), epochs=1, verbose=0, shuffle=False)
    assert optimizer_step(optimizer) == 3
    schedule = kt.TransformerSchedule(tiny_config.d_model, 10)
    np.testing.assert_allclose(float(optimizer.learning_rate), float(schedule(3)), rtol=1e-6)


def test_averaged_checkpoint_is_the_elementwise_mean(tmp_path, tiny_config):
    run = RunDirectory(str(tmp_path / "run"))
    run.save_config(tiny_config)
    model, optimizer = compiled(tiny_config)
    writer = CheckpointWriter(model, optimizer, run.checkpoint_dir, max_to_keep=5)
    snapshots = []
    for step in range(4):
        model.fit(dataset(1, first_seed=step), epochs=1, verbose=0, shuffle=False)
        writer.save()
        snapshots.append(values(model.weights))
    output, inputs = average_checkpoints(run, 3)
    assert [p.rsplit("/", 1)[1] for p in inputs] == ["ckpt-2", "ckpt-3", "ckpt-4"]
    assert output.endswith("averaged/ckpt-4")

    averaged = run.load_model(output)
    reader = tf.train.load_checkpoint(output)
    assert len(averaged.weights) == len(model.weights)
    for i, variable in enumerate(averaged.weights):
        got = np.array(keras.ops.convert_to_numpy(variable))
        if np.issubdtype(got.dtype, np.floating):
            expected = np.mean([s[i] for s in snapshots[1:]], axis=0)
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    # Not a trivial mean: the inputs differ.
    assert not np.allclose(snapshots[1][0], snapshots[3][0])
    assert any(k.startswith("model/") for k in reader.get_variable_to_shape_map())
    with pytest.raises(ValueError, match="keeps only 4"):
        average_checkpoints(run, 5)
    # Unless told to take what there is: all four, newest last.
    output, inputs = average_checkpoints(run, 5, allow_fewer=True)
    assert [p.rsplit("/", 1)[1] for p in inputs] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]
    assert output.endswith("averaged/ckpt-4")
    # What was averaged is recorded next to it.
    sources = json.loads((tmp_path / "run" / "averaged" / "sources.json").read_text())
    assert (sources["chosen"], sources["num"], sources["newest_training_step"]) == ("last", 4, 4)
    assert [s["step"] for s in sources["sources"]] == [1, 2, 3, 4]
    output, inputs = average_checkpoints(run, 0, checkpoints=["ckpt-1", "ckpt-3"])
    assert output.endswith("averaged/ckpt-3")
    sources = json.loads((tmp_path / "run" / "averaged" / "sources.json").read_text())
    assert sources["chosen"] == "explicit"
    assert [s["prefix"] for s in sources["sources"]] == ["checkpoints/ckpt-1",
                                                         "checkpoints/ckpt-3"]
    with pytest.raises(ValueError, match="No checkpoints named"):
        average_checkpoints(run, 0, checkpoints=[])
    # A path is not guessed into a run directory: the error says what to pass.
    with pytest.raises(TypeError, match=r"RunDirectory\("):
        average_checkpoints(run.path, 3)


def directory_bytes(path):
    return {name: open(os.path.join(path, name), "rb").read() for name in os.listdir(path)}


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_a_failed_average_leaves_the_previous_one_whole(tmp_path, tiny_config, monkeypatch,
                                                        exchange):
    if not exchange:  # where the system cannot swap two names in one step
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    run = RunDirectory(str(tmp_path / "run"))
    run.save_config(tiny_config)
    model, optimizer = compiled(tiny_config)
    writer = CheckpointWriter(model, optimizer, run.checkpoint_dir, max_to_keep=5)
    for step in range(3):
        model.fit(dataset(1, first_seed=step), epochs=1, verbose=0, shuffle=False)
        writer.save()
    # A process killed while averaging left a temporary directory: it is
    # removed by the next averaging.
    os.makedirs(os.path.join(run.path, ".tmp-averaged-killed", "x"))
    previous_umask = os.umask(0o022)
    try:
        output, _ = average_checkpoints(run, 2)
    finally:
        os.umask(previous_umask)
    assert output == os.path.join(run.averaged_dir, "ckpt-3")
    assert sorted(os.listdir(run.path)) == ["averaged", "checkpoints", "config.json"]
    assert stat.S_IMODE(os.stat(run.averaged_dir).st_mode) == 0o755
    assert all(stat.S_IMODE(os.stat(os.path.join(run.averaged_dir, name)).st_mode) == 0o644
               for name in os.listdir(run.averaged_dir))
    # The `checkpoint` state names the final place, not the temporary one.
    assert run.resolve_checkpoint("averaged")[0] == output
    assert ".tmp-" not in (tmp_path / "run" / "averaged" / "checkpoint").read_text()
    before = directory_bytes(run.averaged_dir)
    resolved = run.resolve_checkpoint("averaged")

    # Another average fails after its checkpoint is written, while writing
    # its sources.json.
    def disk_full(path, data):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoints, "write_atomically", disk_full)
    with pytest.raises(OSError, match="disk full"):
        average_checkpoints(run, 0, checkpoints=["ckpt-1", "ckpt-2"])
    assert directory_bytes(run.averaged_dir) == before
    assert run.resolve_checkpoint("averaged") == resolved
    assert run.averaged_sources()["sources"][-1]["step"] == 3
    run.load_model("averaged", quiet=True)
    assert sorted(os.listdir(run.path)) == ["averaged", "checkpoints", "config.json"]
