"""tf.distribute checks, each in fresh processes (logical CPU devices and
MultiWorkerMirroredStrategy must be set up before TensorFlow initialises)."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from support.processes import ENV, ROOT, write_corpus


def test_mirrored_step_equals_one_device_step():
    out = subprocess.run([sys.executable, "-m", "tests.support.mirrored_step"],
                         capture_output=True, text=True, env=ENV, timeout=240, cwd=ROOT)
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and line, out.stdout[-2000:] + out.stderr[-3000:]
    result = json.loads(line[0][len("RESULT "):])
    assert result["replicas"] == 2
    assert result["max_update"] > 1e-2  # the step moved the weights
    assert result["max_weight_diff"] < 1e-5
    assert abs(result["mirrored_loss"] - result["single_loss"]) < 1e-5
    # The fused Adam under MirroredStrategy: Keras's Adam's result, and the
    # two devices' copies of every variable identical.
    assert result["fused_adam_optimizer"] == "FusedAdam"
    assert result["fused_adam_max_update"] > 1e-2
    assert result["fused_adam_vs_keras_adam_max_weight_diff"] < 1e-5
    assert result["fused_adam_replica_copies_max_diff"] == 0.0


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.e2e
def test_multi_worker_mirrored_workers_agree(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_corpus(str(data))
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    command = [sys.executable, os.path.join(ROOT, "training", "train.py"),
               "--run-dir", str(tmp_path / "run"), "--data", f"text:{data}",
               "--src-lang", "en", "--tgt-lang", "de", "--config", "tiny",
               "--vocab-size", "400", "--train-steps", "3", "--steps-per-epoch", "3",
               "--checkpoint-every", "2", "--batch-tokens", "256", "--max-length", "64",
               "--shuffle-buffer", "50", "--strategy", "multi_worker_mirrored",
               "--valid-split", "val", "--bleu-sentences", "0", "--verbose", "2",
               "--set", "num_layers=1"]
    workers = []
    for index in range(2):
        env = {**ENV, "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})}
        workers.append(subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT))
    outputs = []
    try:
        for w in workers:
            outputs.append(w.communicate(timeout=300)[0])
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    for w, out in zip(workers, outputs):
        assert w.returncode == 0, out[-4000:]
    digests = [re.search(r"finished at step (\d+); weights sha256 (\w+)", out) for out in outputs]
    assert all(digests), outputs[0][-2000:] + outputs[1][-2000:]
    assert [int(d.group(1)) for d in digests] == [3, 3]
    assert digests[0].group(2) == digests[1].group(2)
    assert "CollectiveAllReduceStrategy with 2 replica(s)" in outputs[0]
    checkpoints = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
    assert "ckpt-2.index" in checkpoints and "ckpt-3.index" in checkpoints
    assert not [c for c in checkpoints if c.startswith(".worker")]  # non-chief copies removed
