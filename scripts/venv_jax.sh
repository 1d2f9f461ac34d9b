# Sourced by scripts/test.sh: a second, TensorFlow-free environment, .venv-jax
# (keras + jax[cpu] only), in which tests/test_jax_backend.py runs the model
# with KERAS_BACKEND=jax. Created once (idempotent); KT_SKIP_JAX=1 skips it.
# The library is imported from the checkout (PYTHONPATH), not installed there,
# so this venv never pulls TensorFlow.
if [ -z "${KT_SKIP_JAX:-}" ]; then
  jax_spec="keras>=3.15,<4 jax[cpu]>=0.4.30 numpy"
  jax_stamp=.venv-jax/.installed-$(echo "$jax_spec" | python -c "import hashlib,sys;print(hashlib.sha1(sys.stdin.buffer.read()).hexdigest()[:12])")
  if [ ! -f "$jax_stamp" ]; then
    rm -rf .venv-jax
    if "${PYTHON:-python3}" -m venv .venv-jax \
        && .venv-jax/bin/python -m pip install --quiet $jax_spec; then
      touch "$jax_stamp"
    else
      echo "WARNING: could not install jax into .venv-jax; the JAX backend tests will be SKIPPED." >&2
    fi
  fi
  if [ -f "$jax_stamp" ]; then
    export KT_JAX_PYTHON="$PWD/.venv-jax/bin/python"
  fi
fi
