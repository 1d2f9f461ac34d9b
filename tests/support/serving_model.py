"""For tests of `kt-serve`: the tiny exported translator and the server
subprocess of benchmarks/tiny_serving.py, which the serving benchmark
shares."""

from benchmarks.tiny_serving import (  # noqa: F401  (re-exported for the tests)
    MAX_LENGTH,
    READY,
    export_tiny_model,
    export_tiny_versions,
    start_server,
    stop_server,
)
