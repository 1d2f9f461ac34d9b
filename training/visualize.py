"""kt-visualize as a script: draw the attention maps of one translation. Run with --help.

The command lives in keras_transformer/cli/visualize.py; this script runs it from a
checkout where the package is installed (scripts/venv.sh installs it).
"""

import sys

from keras_transformer.cli.visualize import main

if __name__ == "__main__":
    sys.exit(main())
