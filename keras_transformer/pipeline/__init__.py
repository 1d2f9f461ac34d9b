"""The training pipeline as a library (TensorFlow-only): what `kt-train`
runs, callable from a script.

- `settings`: `TrainingConfig`, every setting of a run, its settings file
  and `--set` overrides, and their checks;
- `corpus`: `Corpus`, the run's text pairs by split;
- `vocabulary`: the run's vocabularies (given, fine-tuned from, or trained);
- `trainer`: `train(config)`, from data to the checkpoint to ship.

A script that drives `model.fit` itself uses the pieces under it instead:
`SubwordTokenizer`, `data.translation_dataset`, `TrainingRun`, `Translator`,
`export_saved_model` (docs/api.md).
"""
