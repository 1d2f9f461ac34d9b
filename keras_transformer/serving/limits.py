"""The work one request to kt-serve may ask for, by default: the sentences
it holds and the beam it searches with (the decoder's key/value cache grows
with their product). Plain constants, so the command line reads them
without loading TensorFlow."""

DEFAULT_MAX_REQUEST_SENTENCES = 512
DEFAULT_MAX_BEAM_SIZE = 64
