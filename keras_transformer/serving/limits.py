"""kt-serve's limits on what requests may ask of it, by default. Plain
constants, so the command line reads them without loading TensorFlow.

- The sentences one request holds and the beam it searches with (the
  decoder's key/value cache grows with their product).
- The work one request may ask for (`work`: sentences x beam x (source
  pieces + target limit), which its memory grows with), and the chunk size
  of a request run in parts (a deadline stops the parts not yet started).
- The unbatched requests waiting for or running on the model, and the HTTP
  requests in flight (beyond either: 503).
- Connections: the size of a request line (414 beyond) and of its headers
  (431 beyond), and the open connections (beyond: the longest idle one is
  closed, or 503 when all are busy).
- Time: for a request's headers and body to arrive (else the connection
  closes, or 408), and for a predict request in all (TF Serving's
  `--rest_api_timeout_in_ms`, 504 beyond).
- Tries of a version that fails to load, and their interval (TF Serving's
  `--max_num_load_retries` and `--load_retry_interval_micros`).
"""

DEFAULT_MAX_REQUEST_SENTENCES = 512
DEFAULT_MAX_BEAM_SIZE = 64
DEFAULT_MAX_REQUEST_WORK = 800_000
DEFAULT_CHUNK_WORK = 65_536
DEFAULT_MAX_ENQUEUED_REQUESTS = 64
DEFAULT_MAX_CONCURRENT_REQUESTS = 256
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_MAX_URL_BYTES = 8 * 1024
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0
DEFAULT_HEADER_TIMEOUT_SECONDS = 30.0
DEFAULT_REST_API_TIMEOUT_MS = 30000
DEFAULT_MAX_NUM_LOAD_RETRIES = 5
DEFAULT_LOAD_RETRY_INTERVAL_MICROS = 60_000_000
