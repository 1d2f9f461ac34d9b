# Sourced by scripts/test.sh: .venv-beam, the main .venv plus Apache Beam
# (the `beam` extra), in which tests/test_beam.py runs the Beam pipeline
# on the DirectRunner. Beam pins protobuf below the version the main
# environment has, so it lives apart: .venv-beam sees .venv's packages
# through a .pth file and holds only Beam and what Beam pins. Created once
# (idempotent); KT_SKIP_BEAM=1 skips it.
if [ -z "${KT_SKIP_BEAM:-}" ]; then
  beam_spec="apache-beam==2.77.*"
  beam_stamp=.venv-beam/.installed-$(echo "$beam_spec" | python -c "import hashlib,sys;print(hashlib.sha1(sys.stdin.buffer.read()).hexdigest()[:12])")
  if [ ! -f "$beam_stamp" ]; then
    rm -rf .venv-beam
    if "${PYTHON:-python3}" -m venv --without-pip .venv-beam \
        && python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
          > "$(.venv-beam/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/main-venv.pth" \
        && python -m pip --python .venv-beam/bin/python install --quiet "$beam_spec" \
          2>/dev/null; then
      touch "$beam_stamp"
    else
      echo "WARNING: could not install Apache Beam into .venv-beam; the Beam tests will be SKIPPED." >&2
    fi
  fi
  if [ -f "$beam_stamp" ]; then
    export KT_BEAM_PYTHON="$PWD/.venv-beam/bin/python"
  fi
fi
