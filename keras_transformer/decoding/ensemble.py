"""Several Transformers decoding as one: at each step, the mean of their
next-token probabilities (a checkpoint ensemble, fairseq's `--path a:b`).

`TransformerEnsemble` has the decoding surface of a `Transformer`
(`config`, `encode`, `init_decoding_cache`, `decode_step`, `decoder`), so
`beam_search_translate`, `greedy_translate`, `sample_translate` and
`Translator` take it where they take a model. `keras.ops` only.
"""

import math

from keras import ops

from keras_transformer.decoding.common import log_softmax

# What the members must share for their distributions to be averaged token by
# token and their outputs to be read with one tokenizer.
SHARED_FIELDS = ("vocab_size", "target_vocab_size", "pad_id", "bos_id", "eos_id",
                 "max_length")


class TransformerEnsemble:
    """Built `Transformer`s over one vocabulary, decoded as one model.

    Each member encodes the source and keeps its own decoder cache; a step
    runs every member and returns `log(mean_i p_i)` over the vocabulary
    (float32, each member's log-probabilities floored as the searches floor
    them), the mixture of their distributions, not an average of their
    weights (`kt-average` averages weights into one model). A search then
    costs the members' summed time. One member decodes exactly as the
    model alone.

    Args:
        models: a non-empty sequence of built `Transformer`s whose configs
            agree on `SHARED_FIELDS` (`ValueError` naming the field and the
            member otherwise); their shapes may differ.

    Example:

    ```python
    import keras
    import keras_transformer as kt
    from keras_transformer.decoding import beam_search_translate

    config = kt.get_config("tiny", vocab_size=100)
    models = [kt.Transformer(config) for _ in range(2)]   # e.g. two seeds' runs
    for model in models:
        model.build()
    ensemble = kt.TransformerEnsemble(models)
    source = keras.ops.convert_to_tensor([[5, 6, 7, 3]])  # tokens + eos
    sequences, scores = beam_search_translate(ensemble, source, beam_size=2)
    assert tuple(sequences.shape)[:2] == (1, 2)   # (batch, beam, length)
    ```
    """

    def __init__(self, models):
        models = list(models)
        if not models:
            raise ValueError("An ensemble needs at least one model.")
        first = models[0].config
        for index, model in enumerate(models[1:], 1):
            for field in SHARED_FIELDS:
                if getattr(model.config, field) != getattr(first, field):
                    raise ValueError(
                        f"Ensemble member {index} has {field}={getattr(model.config, field)!r}"
                        f" but member 0 has {getattr(first, field)!r}: the members must share "
                        "the vocabulary and special ids.")
        self.models = models
        self.config = first
        self._cache_sizes = [len(model.decoder.decoder_layers) for model in models]

    @property
    def decoder(self):
        """The first member's decoder, whose `grow_cache` grows the members'
        caches, which `init_decoding_cache` lays out as one list of layers."""
        return self.models[0].decoder

    @property
    def weights(self):
        return [weight for model in self.models for weight in model.weights]

    def encode(self, source_ids, training=False):
        """`(memories, memory_mask)`: each member's encoder output, in order,
        and the source mask (the same for every member: one pad id)."""
        encoded = [model.encode(source_ids, training=training) for model in self.models]
        return [memory for memory, _ in encoded], encoded[0][1]

    def init_decoding_cache(self, memories, max_length):
        """The members' caches (see `Transformer.init_decoding_cache`),
        concatenated: member 0's layers, then member 1's, ..."""
        return [layer for model, memory in zip(self.models, memories)
                for layer in model.init_decoding_cache(memory, max_length)]

    def decode_step(self, ids, step, cache, memory_mask, parents=None):
        """As `Transformer.decode_step`; the returned "logits" `(batch,
        vocab)` are the ensemble's normalised float32 log-probabilities (a
        single member's own logits)."""
        if len(self.models) == 1:
            return self.models[0].decode_step(ids, step, cache, memory_mask, parents)
        log_probs, new_cache, start = [], [], 0
        for model, size in zip(self.models, self._cache_sizes):
            logits, member_cache = model.decode_step(
                ids, step, cache[start:start + size], memory_mask, parents)
            log_probs.append(log_softmax(logits))
            new_cache.extend(member_cache)
            start += size
        mixture = ops.logsumexp(ops.stack(log_probs), axis=0) - math.log(len(log_probs))
        return mixture, new_cache
