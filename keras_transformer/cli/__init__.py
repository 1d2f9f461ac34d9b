"""The command-line tools, installed as console scripts (setup.cfg):

    kt-train      cli/train.py      train on a parallel corpus; resumes a run directory
    kt-average    cli/average.py    average a run's last checkpoints
    kt-evaluate   cli/evaluate.py   translate a test set and score it with sacreBLEU
    kt-translate  cli/translate.py  translate lines from stdin or a file
    kt-export     cli/export.py     export a SavedModel for TF Serving
    kt-visualize  cli/visualize.py  attention maps of one translation
    kt-demo       cli/demo.py       the Quick start: all of the above on the built-in corpus

Each module's `main(argv=None)` returns the exit status. A process started
as one of these commands runs `keras_transformer.startup.start()` (quiet
TensorFlow logs, glibc malloc settings) before TensorFlow is imported: the
package's `__init__` does it, since importing a command imports the package
first. `training/*.py` are the same commands as scripts.
"""
