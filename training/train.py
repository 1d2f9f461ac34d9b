"""Train the Transformer on a parallel corpus; run with --help.

A thin command over `keras_transformer.training.trainer`.
"""

if __name__ == "__main__":
    # Before TensorFlow loads: glibc malloc settings (see training/fast_malloc.py).
    import fast_malloc

    fast_malloc.apply()

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_transformer.training.trainer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
