"""kt-export as a script: export a trained model as a SavedModel. Run with --help.

The command lives in keras_transformer/cli/export.py; this script runs it from a
checkout where the package is installed (scripts/venv.sh installs it).
"""

import sys

from keras_transformer.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
