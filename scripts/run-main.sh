#!/usr/bin/env bash
# The main job: set up (see bootstrap.sh), then run one R2S2R iteration on the
# MuJoCo twin. Extra arguments go to `r2s2r iterate` (e.g. --set campaign=demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export MUJOCO_GL=egl PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true
exec .venv/bin/r2s2r iterate "$@"
