#!/usr/bin/env bash
# The main job: set up (see bootstrap.sh), then run a two-iteration R2S2R campaign on the
# MuJoCo twin. Extra arguments go to `r2s2r campaign` (e.g. --set campaign=demo -n 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export MUJOCO_GL=egl PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true
exec .venv/bin/r2s2r campaign -n 2 "$@"
