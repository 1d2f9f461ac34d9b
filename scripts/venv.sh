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
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# glibc malloc settings that stop TensorFlow's per-step page faults on CPU
# (see training/fast_malloc.py; the training/ scripts also set them themselves).
export MALLOC_MMAP_MAX_=${MALLOC_MMAP_MAX_:-0}
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-17179869184}
export MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-1}
