import keras
import numpy as np
import pytest

from keras_transformer import TransformerSchedule, transformer_adam


def paper_lr(step, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 4000, 40000])
def test_schedule_matches_the_formula(step):
    schedule = TransformerSchedule(512, 4000)
    # Keras passes the 0-based iteration count; paper step = iteration + 1.
    assert float(schedule(step - 1)) == pytest.approx(paper_lr(step), rel=1e-6)


def test_schedule_is_finite_at_zero_and_serializes():
    schedule = TransformerSchedule(256, 100, scale=2.0)
    assert np.isfinite(float(schedule(0))) and float(schedule(0)) > 0
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert float(clone(50)) == pytest.approx(float(schedule(50)))


def test_adam_uses_the_paper_betas():
    opt = transformer_adam(512)
    assert (opt.beta_1, opt.beta_2, opt.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(opt.learning_rate, TransformerSchedule) or callable(opt._learning_rate)
