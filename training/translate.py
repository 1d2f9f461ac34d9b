"""kt-translate as a script: translate one sentence per line. Run with --help.

The command lives in keras_transformer/cli/translate.py; this script runs it from a
checkout where the package is installed (scripts/venv.sh installs it).
"""

import sys

from keras_transformer.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
