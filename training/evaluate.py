"""kt-evaluate as a script: translate a test set and score it with sacreBLEU. Run with --help.

The command lives in keras_transformer/cli/evaluate.py; this script runs it from a
checkout where the package is installed (scripts/venv.sh installs it).
"""

import sys

from keras_transformer.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
