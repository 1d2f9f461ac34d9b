# Sourced by the scripts: creates .venv on first use, installs this package
# (editable, with extras) when setup.cfg changed since the last install, and
# activates it. Needs only python3 (3.10+) and pip.
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
stamp=.venv/.installed-$(cat setup.cfg pyproject.toml | python -c "import hashlib,sys;print(hashlib.sha1(sys.stdin.buffer.read()).hexdigest()[:12])")
if [ ! -f "$stamp" ]; then
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet -e ".[test,viz]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# glibc malloc settings that keep TensorFlow's freed tensor memory for reuse,
# in the environment form (keras_transformer/malloc.py, ENVIRONMENT), so
# the tests and benchmarks run as the kt-* commands do (those apply them
# themselves). KT_FAST_MALLOC=0 leaves malloc alone.
if [ "${KT_FAST_MALLOC:-1}" != 0 ]; then
  export MALLOC_MMAP_MAX_=${MALLOC_MMAP_MAX_:-0}
  export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-17179869184}
  export MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-1}
fi
