"""Shared fixtures. Environment variables are set before Prefect/MLflow/MuJoCo import."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_PREFECT_HOME = tempfile.mkdtemp(prefix="r2s2r-test-prefect-")
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# the commands under test start Prefect's temporary server, as the flows run in-process do; a
# local server shared between commands is tested in test_local_server.py
os.environ["R2S2R_PREFECT_SERVER_IDLE_S"] = "0"
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from pipeline.config import LoadedConfigs, TwinConfig, load_all  # noqa: E402
from pipeline.policies import REST_TARGET  # noqa: E402
from storage.layout import Ref, RunLayout, write_manifest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PIPELINE = REPO / "configs" / "pipeline" / "default.yaml"


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``condition()`` came true within ``timeout_s`` seconds (asked every 0.2 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def small_twin(twin: TwinConfig) -> TwinConfig:
    """The default twin with a small, slow camera so tests render quickly."""
    camera = twin.camera.model_copy(update={"width_px": 320, "height_px": 240, "rate_hz": 5.0})
    return twin.model_copy(update={"camera": camera})


@pytest.fixture(scope="session")
def default_configs() -> LoadedConfigs:
    return load_all(DEFAULT_PIPELINE)


SMALL_SYSID = {
    "sysid.dt_s": 0.005,
    "sysid.gradient.iterations": 3,
    "sysid.gradient.warmup_iterations": 2,
    "sysid.gradient.min_iterations": 1,
    "sysid.gradient.average_last": 1,
    "sysid.loss.chunk_s": 2.0,
    "sysid.latency.grid_s": [0.0, 0.06],
    "sysid.latency.speed_factors": [1.0],
    "sysid.start_fit.iterations": 2,
    "sysid.start_fit.refits": 0,
    "sysid.search.generations": 2,
    "sysid.search.population": 4,
    "sysid.gait_shooting.iterations": 1,
    "sysid.gait_shooting.restarts": 0,
    "sysid.gait_shooting.parameters": ["motor_speed", "restitution"],
}
"""A sysid short enough for flow tests (its accuracy is tested in test_sysid.py). Gait shooting
runs one step on two parameters, so friction keeps the search's profile range."""

SMALL_LEARN = {
    "learn.model.dt_s": 0.01,
    "learn.model.spin": "held",
    "learn.model.latent": 8,
    "learn.model.message_passing_steps": 1,
    "learn.pretrain.random_policies": 2,
    "learn.pretrain.targets": 3,
    "learn.pretrain.gait_cycles": 1,
    "learn.pretrain.curriculum.lengths": [1, 2],
    "learn.pretrain.curriculum.epochs": [1, 1],
    "learn.pretrain.curriculum.learning_rates": [1e-3, 1e-3],
    "learn.fine_tune.lengths": [2],
    "learn.fine_tune.epochs": [1],
    "learn.fine_tune.learning_rates": [1e-4],
}
"""A learned contact small enough for flow tests, at half the default's steps (what it learns, and
each spin, is tested in test_learned.py)."""

SMALL_GAITS = {
    "gaits.search.depth": 2,
    "gaits.search.validate_top": 2,
    "gaits.straight_cycles": 1,
    "gaits.turn_cycles": 1,
    "gaits.expansion_starts": 3,
}
"""A gait search and expansion short enough for flow tests (the search is tested in test_gaits.py)."""

SMALL_REDEPLOY = {"redeploy.policies": ["turning"]}
"""One policy from the three default starts."""
SMALL_FOLLOW = {
    "follow.table.paper_actions": ["roll_100", "roll_90_150", "roll_150_90", "ccw", "cw"],
    "follow.table.ensemble_motor_speed": 0.0,
}
"""The paper's actions that roll and turn the robot (docs/follow.md), one ensemble member."""
FOLD = np.vstack([[0.0, 0.9, 0.0, 0.0, 0.9, 0.0], REST_TARGET])
"""From the rest pose, four actuated cables retracted lay the prism flat: in the engine with the
robot config's values (highest end cap 0.064 rod lengths above the ground, forward 0.079 m, the
rest shape not reached in 1 s) and on the twin (0.061)."""


def write_test_pipeline(
    folder: Path, campaign: str = "test", n_targets: int = 4, twin: str = "twin.yaml", **collect: object
) -> Path:
    """Write a pipeline config (and a small-camera copy of the twin config ``configs/hardware/<twin>``)
    under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    base = load_all(DEFAULT_PIPELINE, {"hardware_config": REPO / "configs" / "hardware" / twin})
    twin_path = folder / "twin.yaml"
    twin_path.write_text(yaml.safe_dump(small_twin(base.twin).model_dump(mode="json")))
    pipeline = base.pipeline.updated(
        {
            "campaign": campaign,
            "runs_dir": folder / "runs",
            "hardware_config": twin_path,
            "collect.random.n_targets": n_targets,
            **{f"collect.{key}": value for key, value in collect.items()},
            **SMALL_SYSID,
            **SMALL_LEARN,
            **SMALL_GAITS,
            **SMALL_REDEPLOY,
            **SMALL_FOLLOW,
        }
    )
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json")))
    return path


@pytest.fixture
def test_pipeline(tmp_path: Path) -> Path:
    return write_test_pipeline(tmp_path)


@pytest.fixture(scope="module")
def twin(default_configs: LoadedConfigs):
    """A small-camera twin per test module: its noise state depends only on the module's own tests,
    whichever modules an xdist worker ran before."""
    from pipeline.hardware.twin import MujocoTwin

    robot = MujocoTwin(default_configs.robot, small_twin(default_configs.twin))
    yield robot
    robot.close()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``scripts/test.sh`` runs two workers), each worker's torch gets its
    share of the cores: the small engine batches of the tests leave a second thread idle, and
    two workers with one thread each use both cores."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


PREFECT_SERVER_MODULES = ("tests/test_collect_flow.py", "tests/test_runners.py", "tests/test_stages.py")
"""The test modules with tests on the shared Prefect server (the ``prefect_server`` fixture)."""


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unused where xdist is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist sends whole test modules to a worker (a module's fixtures are built once), and
    the modules of :data:`PREFECT_SERVER_MODULES` together (the session starts one server)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "prefect-server" if module in PREFECT_SERVER_MODULES else module

    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def prefect_server():
    """One Prefect ephemeral API server for the whole test session (see :data:`PREFECT_SERVER_MODULES`)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def empty_overlays(configs: LoadedConfigs, iteration: int) -> dict[str, Ref]:
    """Attach and sysid stage outputs by hand with empty overlays (the robot config as it is), and
    a learn stage output whose contact network answers no contact at all (its decoder's last layer
    zero: the learned engine is the free motion)."""
    from pipeline.physics.model import RobotModel
    from storage.catalog import CONTACT_MODEL_FILE
    from storage.contact_model import build_network, save_contact_model

    layout = RunLayout.of(configs)
    refs = {}
    for stage, name in (("attach", "attachment.yaml"), ("sysid", "identified.yaml")):
        folder = layout.stage_dir(iteration, stage)
        folder.mkdir(parents=True)
        (folder / name).write_text("{}\n")
        refs[stage] = write_manifest(folder, stage, complete=True, summary={})
    folder = layout.stage_dir(iteration, "learn")
    folder.mkdir(parents=True)
    learn = configs.pipeline.learn.model
    network = build_network(RobotModel.from_robot(configs.robot), learn)
    network.decoder[-1].weight.data.zero_()
    network.decoder[-1].bias.data.zero_()
    save_contact_model(folder / CONTACT_MODEL_FILE, network, learn, configs.robot, {})
    refs["learn"] = write_manifest(folder, "learn", complete=True, summary={})
    return refs
