"""Process environment for Prefect, MLflow and MuJoCo; call before importing them."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pipeline.errors import R2S2RError
from storage.layout import RunLayout

PREFECT_RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")
"""The loggers through which Prefect reports a task or flow that raised."""


def _not_a_user_error(record: logging.LogRecord) -> bool:
    """False for Prefect's report of a run that raised an :class:`R2S2RError` (with its traceback):
    the command line prints that error as one line itself."""
    return not (record.exc_info and isinstance(record.exc_info[1], R2S2RError))


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
    for name in PREFECT_RUN_LOGGERS:
        logger = logging.getLogger(name)
        if _not_a_user_error not in logger.filters:
            logger.addFilter(_not_a_user_error)
