"""kt-average as a script: average the last checkpoints of a run. Run with --help.

The command lives in keras_transformer/cli/average.py; this script runs it from a
checkout where the package is installed (scripts/venv.sh installs it).
"""

import sys

from keras_transformer.cli.average import main

if __name__ == "__main__":
    sys.exit(main())
