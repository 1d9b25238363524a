#!/usr/bin/env bash
# The whole test suite on the GPU machine, its image as it is (torch 2.11, its transformers 5.17) or with
# the transformers of .whl/ (WHEEL_TRANSFORMERS=1): the CUDA tests run there, and the rest shows what
# differs from a CPU machine. Run from the repo root after
#   bash ../shared/device/wheels.sh transformers==5.24.0 hypothesis sortedcontainers attrs pytest-xdist execnet ijson
# (carry .whl). Installs the wheels into the image's Python and puts the working tree on its path, as an
# editable install would. Writes under $OUT: versions.txt, pytest.txt (summary with skip reasons).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
keep='/(pydantic|annotated_types|typing_|simpy|hypothesis|sortedcontainers|attrs|pytest_xdist|execnet|ijson)'
[ "${WHEEL_TRANSFORMERS:-0}" = 1 ] && keep='\.whl$'
# shellcheck disable=SC2046
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade $(ls .whl/*.whl | grep -E "$keep") 2>&1 | grep -v '^WARNING' | tail -3
echo "$PWD" > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/opgraph-dev.pth"
{
  timeout 10 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, typer, numpy, pytest; print('torch', torch.__version__, '| transformers', transformers.__version__, '| typer', typer.__version__, '| numpy', numpy.__version__, '| pytest', pytest.__version__)"
} | tee "$OUT/versions.txt"
timeout "${TIMEOUT_S:-500}" python3 -m pytest -n "${WORKERS:-14}" -q -rs -p no:cacheprovider tests > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?" >> "$OUT/pytest.txt"
grep -E '^(FAILED|ERROR)|passed|failed|pytest exit' "$OUT/pytest.txt" | tail -40
