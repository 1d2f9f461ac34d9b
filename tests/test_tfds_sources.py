import pytest
import tensorflow_datasets as tfds

from keras_transformer.data import sources
from keras_transformer.data.tfds_sources import tfds_source


def first_pairs(dataset, n=3):
    return [(s, t) for s, t in dataset.take(n).as_numpy_iterator()]


@pytest.mark.parametrize("name,langs", [
    ("wmt14_translate/de-en", ("en", "de")),
    ("wmt_t2t_translate/de-en", ("de", "en")),
    ("ted_hrlr_translate/pt_to_en", ("pt", "en")),
])
def test_loads_on_mock_data_in_both_directions(name, langs):
    src, tgt = langs
    with tfds.testing.mock_data(num_examples=4):
        forward = first_pairs(sources.load_pairs(f"tfds:{name}", "train", src, tgt))
        examples = list(tfds.load(name, split="train").take(3).as_numpy_iterator())
        backward = first_pairs(tfds_source(name, "train", tgt, src))
    assert len(forward) == 3
    assert forward == [(e[src], e[tgt]) for e in examples]
    assert backward == [(t, s) for s, t in forward]
    assert all(isinstance(s, bytes) for pair in forward for s in pair)


def test_validation_split_alias_and_unknown_language():
    with tfds.testing.mock_data(num_examples=2):
        assert len(first_pairs(tfds_source("wmt14_translate/de-en", "validation", "en", "de"))) == 2
        with pytest.raises(ValueError, match=r"no language 'fr' for the target; its languages are \['de', 'en'\]"):
            tfds_source("wmt14_translate/de-en", "train", "en", "fr")
