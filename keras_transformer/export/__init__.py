"""Translating and exporting, engines of one contract
(`engine.TranslationEngine`). TensorFlow-only package.

- `signatures`: the serving functions (`TranslatorModule`), what a
  SavedModel holds; `option_checks`: the search options' checks on
  TensorFlow's side; `batches`: a serving function over a list of
  sentences.
- `translator`: `Translator`, the in-process engine over them;
  `loading`: a `Translator` for a run directory's model.
- `saved_model`: export in TF Serving's layout, with its warm-up file
  (`warmup`), and loading an export back (`SavedModelTranslator`).
- `ctranslate2`, `vocabulary_map`, `column_blocks`: the CTranslate2
  export and engine, and the XLA search's column blocks.
- `litert`, `fast_sentencepiece`, `litert_float16`, `litert_translator`:
  one LiteRT file with beam search inside, its vocabulary as
  tensorflow-text's LiteRT ops read it, its float16 weights, and its engine.

The clients of a model server live beside it, in `serving.client`.
"""

from keras_transformer.export.batches import (
    explain_in_batches,
    nbest_in_batches,
    translate_in_batches,
)
from keras_transformer.export.engine import SIGNATURES, ExplainingEngine, TranslationEngine
from keras_transformer.export.loading import translator_from_run_directory
from keras_transformer.export.saved_model import (
    SavedModelTranslator,
    export_translator,
    load_translator,
    open_translator,
    read_examples,
)
from keras_transformer.export.translator import Translator
