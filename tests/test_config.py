import pytest

import keras_transformer as kt
from keras_transformer import TransformerConfig


def test_round_trips_through_dict_and_json():
    config = kt.get_config("base", vocab_size=37000, norm_first=True)
    assert TransformerConfig.from_dict(config.to_dict()) == config
    assert TransformerConfig.from_json(config.to_json()) == config


def test_presets_follow_table_3():
    base = kt.get_config("base", vocab_size=100)
    big = kt.get_config("big", vocab_size=100)
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.dropout,
            base.label_smoothing) == (6, 512, 2048, 8, 0.1, 0.1)
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads, big.dropout) == (
        6, 1024, 4096, 16, 0.3)


@pytest.mark.parametrize("bad, match", [
    (dict(d_model=30, num_heads=4), "divisible"),
    (dict(dropout=1.5), "dropout"),
    (dict(position_encoding="rotary"), "position_encoding"),
    (dict(pad_id=500), "pad_id"),
])
def test_rejects_bad_values_clearly(bad, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(vocab_size=100, **bad)


def test_rejects_unknown_fields():
    with pytest.raises(ValueError, match="Unknown"):
        TransformerConfig.from_dict({"vocab_size": 10, "d_modle": 8})


def test_get_config_takes_the_tokenizer_s_size_and_ids_and_refuses_others():
    import types

    import pytest

    stock = types.SimpleNamespace(vocab_size=8001, pad_id=8000, bos_id=1, eos_id=2)
    config = kt.get_config("tiny", tokenizer=stock)
    assert (config.vocab_size, config.pad_id, config.bos_id, config.eos_id) == (8001, 8000, 1, 2)
    with pytest.raises(ValueError, match=r"`vocab_size=37000` disagrees with the tokenizer's "
                                         r"vocab_size \(8001\)"):
        kt.get_config("tiny", vocab_size=37000, tokenizer=stock)
    with pytest.raises(ValueError, match=r"`pad_id=0` disagrees with the tokenizer's pad_id "
                                         r"\(8000\)"):
        kt.get_config("tiny", tokenizer=stock, pad_id=0)
    target = types.SimpleNamespace(vocab_size=8100, pad_id=8000, bos_id=1, eos_id=3)
    with pytest.raises(ValueError, match=r"target tokenizer's eos_id \(3\) differs"):
        kt.get_config("tiny", tokenizer=stock, target_tokenizer=target)
    target.eos_id = 2
    assert kt.get_config("tiny", tokenizer=stock, target_tokenizer=target).target_vocab_size == 8100
    with pytest.raises(ValueError, match="needs `vocab_size` or `tokenizer`"):
        kt.get_config("tiny")
