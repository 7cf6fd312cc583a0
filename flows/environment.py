"""Process environment for Prefect, MLflow and MuJoCo; call before importing them."""

from __future__ import annotations

import os
from pathlib import Path

from storage.layout import RunLayout


def configure_environment(layout: RunLayout) -> None:
    """Keep Prefect's home inside the runs folder and switch off telemetry; creates nothing.

    Must run before ``prefect`` is imported: Prefect reads its settings at import.
    Values already set in the environment win, so tests and deployments can
    point elsewhere.
    """
    os.environ.setdefault("PREFECT_HOME", str(Path(layout.prefect_home).resolve()))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the first start in a new runs folder creates Prefect's database: 20 s (the default) is not enough here
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MUJOCO_GL", "egl")
