"""kt-train as a script: train the Transformer on a parallel corpus. Run with --help.

The command lives in keras_transformer/cli/train.py; this script runs it from a
checkout where the package is installed (scripts/venv.sh installs it).
"""

import sys

from keras_transformer.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
