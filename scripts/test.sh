#!/usr/bin/env bash
# The test command: set up (see bootstrap.sh), lint, then run the test suite.
# Extra arguments go to pytest (e.g. -m slow, or -m "" for everything).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export MUJOCO_GL=egl PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -p no:dash "$@"
