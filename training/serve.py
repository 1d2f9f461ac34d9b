"""kt-serve as a script: serve exported SavedModels with TF Serving's REST API
and a playground page. Run with --help.

The command lives in keras_transformer/cli/serve.py; this script runs it from a
checkout where the package is installed (scripts/venv.sh installs it).
"""

import sys

from keras_transformer.cli.serve import main

if __name__ == "__main__":
    sys.exit(main())
