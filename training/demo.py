"""kt-demo as a script: the Quick start's main job on the built-in corpus. Run with --help.

The command lives in keras_transformer/cli/demo.py; this script runs it from a
checkout where the package is installed (scripts/venv.sh installs it).
"""

import sys

from keras_transformer.cli.demo import main

if __name__ == "__main__":
    sys.exit(main())
