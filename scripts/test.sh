#!/usr/bin/env bash
# The test command: set up (see bootstrap.sh), lint, then run the test suite.
# Extra arguments go to pytest (e.g. -m slow, or -m "" for everything). The tests run on
# R2S2R_TEST_WORKERS pytest-xdist workers (default 2; 0 runs them in this process), a test module
# per worker at a time (tests/conftest.py: pytest_xdist_make_scheduler).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export MUJOCO_GL=egl PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -p no:dash -n "${R2S2R_TEST_WORKERS:-2}" "$@"
