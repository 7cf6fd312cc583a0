"""The MuJoCo export of the identified robot (pipeline.physics.mjcf_export) and its sysid writer."""

from __future__ import annotations

import math
from pathlib import Path

import mujoco
import numpy as np
import pytest

from pipeline.config import RobotConfig, TwinConfig, load_yaml, robot_with_overlay
from pipeline.control import REST_LENGTH_LIMITS_M
from pipeline.hardware.twin import MujocoTwin
from pipeline.physics.mjcf_export import actuated_speed_m_s, identified_mjcf, restitution_damping_ratio
from pipeline.physics.params import robot_overlay
from pipeline.robot_model import N_ACTUATED, build_cables
from pipeline.truth import twin_true_params
from storage.catalog import MJCF_FILE
from tasks.sysid import write_identified_mjcf

REPO = Path(__file__).resolve().parents[1]
DT_S = 0.002
OVERLAY = {
    "motor": {"speed": 0.9},
    "ground": {"friction": 0.65, "restitution": 0.3},
    "actuated_cable": {"stiffness_n_per_m": 130.0, "damping_n_s_per_m": 1.7},
    "passive_cable": {
        "stiffness_n_per_m": 31.0,
        "cubic_stiffness_n_per_m3": 120.0,
        "damping_n_s_per_m": 1.2,
        "rest_length_m": 0.072,
    },
    "pid": {"latency_s": 0.04},
    "attachment": {"phase_rad": [0.1, -0.05, 0.03]},
}
"""Identified values unlike the defaults, so a wrong mapping shows."""


@pytest.fixture(scope="module")
def tribar() -> RobotConfig:
    return load_yaml(REPO / "configs" / "robot" / "tribar.yaml", RobotConfig)


@pytest.fixture(scope="module")
def robot(tribar) -> RobotConfig:
    return robot_with_overlay(tribar, OVERLAY, Path("identified.yaml"))


@pytest.fixture(scope="module")
def model(robot) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(identified_mjcf(robot, timestep_s=DT_S))


def _at_rest(model: mujoco.MjModel) -> mujoco.MjData:
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, "rest"))
    mujoco.mj_forward(model, data)
    return data


def _caps(model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
    ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"cap{c}") for c in range(6)]
    return data.geom_xpos[ids].copy()


def test_model_carries_the_config_values(model, robot) -> None:
    k, b = robot.actuated_cable.stiffness_n_per_m, robot.actuated_cable.damping_n_s_per_m
    speed = robot.motor.speed * robot.motor.omega_max_rad_s * robot.motor.winch_radius_m
    assert actuated_speed_m_s(robot) == pytest.approx(speed)
    assert model.nu == N_ACTUATED and model.ntendon == 9
    for j in range(N_ACTUATED):
        assert model.actuator(j).name == model.tendon(j).name == f"cable{j}"
        assert model.actuator_dyntype[j] == mujoco.mjtDyn.mjDYN_INTEGRATOR
        assert model.actuator_gainprm[j, 0] == pytest.approx(k)
        assert model.actuator_biasprm[j, 1:3] == pytest.approx([-k, -b])
        rest = model.actuator_biasprm[j, 0] / k
        assert model.actuator_actrange[j] == pytest.approx(np.subtract(REST_LENGTH_LIMITS_M, rest))
        assert model.actuator_ctrlrange[j] == pytest.approx([-speed, speed])
        assert model.actuator_forcerange[j, 1] == 0.0
        assert model.actuator_delay[j] == pytest.approx(robot.pid.latency_s)
        assert model.tendon_stiffness[j] == 0.0 and model.tendon_damping[j] == 0.0
    passive = robot.passive_cable
    for j in range(N_ACTUATED, 9):
        assert model.tendon_stiffness[j] == pytest.approx(passive.stiffness_n_per_m)
        assert model.tendon_stiffnesspoly[j, :2] == pytest.approx([0.0, passive.cubic_stiffness_n_per_m3])
        assert model.tendon_damping[j] == pytest.approx(passive.damping_n_s_per_m)
        assert model.tendon_lengthspring[j] == pytest.approx([0.0, passive.rest_length_m])
    assert model.geom_friction[:, 0] == pytest.approx(np.full(model.ngeom, robot.ground.friction))
    stiffness, damping = -model.geom_solref[0]
    assert damping / (2 * math.sqrt(stiffness)) == pytest.approx(restitution_damping_ratio(robot.ground.restitution))
    assert model.opt.timestep == DT_S and model.opt.gravity == pytest.approx([0, 0, -9.81])
    # cable ends at the identified attachment phases
    for cable in build_cables(robot, robot.attachment.phase_rad):
        for side, end in (("a", cable.a), ("b", cable.b)):
            assert model.site(f"cable{cable.index}_{side}").pos == pytest.approx(end.local_m)
    # the keyframe is the bodies' initial pose: resetting starts at rest too
    assert model.nkey == 1 and model.key(0).name == "rest"
    assert model.key_qpos[0] == pytest.approx(model.qpos0) and not model.key_act[0].any()


def test_restitution_mapping() -> None:
    assert restitution_damping_ratio(0.0) == 1.0 and restitution_damping_ratio(1.0) == 0.0
    for e in (0.1, 0.3, 0.8):
        z = restitution_damping_ratio(e)
        assert math.exp(-z * math.pi / math.sqrt(1 - z * z)) == pytest.approx(e)


def test_rest_keyframe_stands_still_on_face_025(model, robot) -> None:
    data = _at_rest(model)
    start = _caps(model, data)
    assert start[[0, 2, 5], 2] == pytest.approx(np.full(3, robot.end_cap.radius_m), abs=1e-3)
    assert (start[[1, 3, 4], 2] > 0.08).all()
    assert (data.actuator_force < -0.5).all()  # prestressed: every actuated cable pulls
    for _ in range(round(2.0 / DT_S)):
        mujoco.mj_step(model, data)
    assert np.linalg.norm(_caps(model, data) - start, axis=1).max() < 0.01


def test_rest_pose_is_close_to_the_twins(tribar) -> None:
    """On the twin's hidden values the export rests within 2.5 cm of the twin's settled pose (whose
    PID stops anywhere inside its tolerance band)."""
    twin_config = load_yaml(REPO / "configs" / "hardware" / "twin.yaml", TwinConfig)
    truth = {name: float(v[0]) for name, v in twin_true_params(tribar, twin_config).as_dict().items()}
    overlay = robot_overlay(truth) | {"attachment": {"phase_rad": list(twin_config.attachment_phase_rad)}}
    robot = robot_with_overlay(tribar, overlay, Path("truth"))
    model = mujoco.MjModel.from_xml_string(identified_mjcf(robot, timestep_s=twin_config.physics.timestep_s))
    twin = MujocoTwin(tribar, twin_config)
    twin_caps = twin.ground_truth(0.0, 0).caps_m
    twin.close()
    assert np.linalg.norm(_caps(model, _at_rest(model)) - twin_caps, axis=1).max() < 0.025


def _tendon_spring_force(model: mujoco.MjModel, data: mujoco.MjData, tendon: int) -> np.ndarray:
    """Generalised spring force (nv,) of one tendon: qfrc_spring with it minus without it."""
    mujoco.mj_forward(model, data)
    with_it = data.qfrc_spring.copy()
    linear, poly = model.tendon_stiffness[tendon], model.tendon_stiffnesspoly[tendon].copy()
    model.tendon_stiffness[tendon], model.tendon_stiffnesspoly[tendon] = 0.0, 0.0
    mujoco.mj_forward(model, data)
    model.tendon_stiffness[tendon], model.tendon_stiffnesspoly[tendon] = linear, poly
    return with_it - data.qfrc_spring


def _tendon_jacobian(model: mujoco.MjModel, data: mujoco.MjData, tendon: int) -> np.ndarray:
    """Dense row (nv,) of the tendon's length Jacobian (MuJoCo stores it sparse)."""
    row = np.zeros(model.nv)
    adr, nnz = model.ten_J_rowadr[tendon], model.ten_J_rownnz[tendon]
    row[model.ten_J_colind[adr : adr + nnz]] = data.ten_J[adr : adr + nnz]
    return row


def test_cables_are_tension_only(robot) -> None:
    model = mujoco.MjModel.from_xml_string(identified_mjcf(robot, timestep_s=DT_S))  # modified below
    data = _at_rest(model)
    passive, length = 6, float(data.ten_length[6])
    model.tendon_lengthspring[passive] = [0.0, length + 0.01]
    assert np.abs(_tendon_spring_force(model, data, passive)).max() == 0.0
    model.tendon_lengthspring[passive] = [0.0, length - 0.01]
    tension = 0.01 * robot.passive_cable.stiffness_n_per_m + 0.01**3 * robot.passive_cable.cubic_stiffness_n_per_m3
    assert _tendon_spring_force(model, data, passive) == pytest.approx(
        -tension * _tendon_jacobian(model, data, passive)
    )

    actuated = 0
    length = float(data.ten_length[actuated])
    rest = model.actuator_biasprm[actuated, 0] / model.actuator_gainprm[actuated, 0]
    data.act[actuated] = length + 0.01 - rest
    mujoco.mj_forward(model, data)
    assert data.actuator_force[actuated] == 0.0
    data.act[actuated] = length - 0.01 - rest
    mujoco.mj_forward(model, data)
    assert data.actuator_force[actuated] == pytest.approx(-0.01 * robot.actuated_cable.stiffness_n_per_m)


def test_driving_an_actuated_cable_shortens_it(model, robot) -> None:
    data = _at_rest(model)
    cable = 3
    a, b = robot.topology.actuated[cable]
    start = np.linalg.norm(np.subtract(*_caps(model, data)[[a, b]]))
    data.ctrl[cable] = -10.0  # clamped to the motor's top speed
    duration = 0.5
    for _ in range(round(duration / DT_S)):
        mujoco.mj_step(model, data)
    # the rest length moved at the top speed, once the latency had passed
    expected = -actuated_speed_m_s(robot) * (duration - robot.pid.latency_s)
    assert data.act[cable] == pytest.approx(expected, abs=2 * DT_S * actuated_speed_m_s(robot))
    assert np.linalg.norm(np.subtract(*_caps(model, data)[[a, b]])) < start - 0.02
    assert not data.act[np.arange(N_ACTUATED) != cable].any()


def test_sysid_writer_writes_a_loadable_model(tribar, tmp_path) -> None:
    overlay = {"ground": {"friction": 0.55, "restitution": 0.2}, "motor": {"speed": 1.1}}
    robot = robot_with_overlay(tribar, overlay, tmp_path / "identified.yaml")
    path = tmp_path / MJCF_FILE
    write_identified_mjcf(path, robot, 0.005)
    model = mujoco.MjModel.from_xml_path(str(path))
    assert model.opt.timestep == 0.005
    assert model.geom_friction[:, 0] == pytest.approx(np.full(model.ngeom, 0.55))
    assert model.actuator_ctrlrange[0, 1] == pytest.approx(actuated_speed_m_s(robot))
    assert not list(tmp_path.glob(".*.tmp"))
