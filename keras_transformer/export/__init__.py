"""Translating and exporting: the `Translator` module, SavedModel export in
TF Serving's layout with its warm-up file (`warmup`), and a REST client,
engines of one contract (`engine.TranslationEngine`). TensorFlow-only
package."""

from keras_transformer.export.engine import SIGNATURES, ExplainingEngine, TranslationEngine
from keras_transformer.export.saved_model import (
    SavedModelTranslator,
    export_translator,
    load_translator,
    open_translator,
    read_examples,
)
from keras_transformer.export.translator import (
    Translator,
    explain_in_batches,
    nbest_in_batches,
    translate_in_batches,
    translator_from_run_directory,
)
