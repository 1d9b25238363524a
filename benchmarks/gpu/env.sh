# Sourced by the GPU scripts: $OUT made, $PY set, and the project importable from the working tree.
# The GPU machine lacks some wheels (pydantic, simpy, nvidia-ml-py): shared/device/wheels.sh fetches
# them into .whl/, installed here into /tmp/site.
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
