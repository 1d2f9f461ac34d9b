"""kt-serve's limits on what requests may ask of it, by default. Plain
constants, so the command line reads them without loading TensorFlow.

- The sentences one request holds and the beam it searches with (the
  decoder's key/value cache grows with their product).
- The unbatched requests waiting for or running on the model, and the HTTP
  requests in flight (beyond either: 503).
- Time: for a request's headers and body to arrive (else the connection
  closes, or 408), and for a predict request in all (TF Serving's
  `--rest_api_timeout_in_ms`, 504 beyond).
- Tries of a version that fails to load, and their interval (TF Serving's
  `--max_num_load_retries` and `--load_retry_interval_micros`).
"""

DEFAULT_MAX_REQUEST_SENTENCES = 512
DEFAULT_MAX_BEAM_SIZE = 64
DEFAULT_MAX_ENQUEUED_REQUESTS = 64
DEFAULT_MAX_CONCURRENT_REQUESTS = 256
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0
DEFAULT_HEADER_TIMEOUT_SECONDS = 30.0
DEFAULT_REST_API_TIMEOUT_MS = 30000
DEFAULT_MAX_NUM_LOAD_RETRIES = 5
DEFAULT_LOAD_RETRY_INTERVAL_MICROS = 60_000_000
