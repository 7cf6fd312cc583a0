"""Anchor for the sysid benchmark: MuJoCo's own system identification (``mujoco.sysid``).

:func:`mujoco_sysid_anchor` fits the twin's data with ``mujoco.sysid.optimize``
(MuJoCo's box-bounded Gauss-Newton ``mujoco.minimize.least_squares`` on a
finite-difference Jacobian) and the toolbox's own residual
(``build_residual_fn``: multithreaded ``mujoco.rollout`` of the candidate model,
predicted sensors sampled at the measured times, difference normalised per
column).

The robot is rebuilt as a **MJCF-native** model. By default the recorded targets
are replayed closed loop (the robot's PID on the model's cable lengths, a custom
rollout); ``replay="open_loop"`` instead feeds the recorded motor commands to the
toolbox's default rollout with no Python in the loop. The
twin's geometry (``build_twin_xml``) gets the pipeline's *nominal* values (robot
config; never the hidden twin values) and these native elements:

* one ``general`` actuator per actuated cable, ``ctrl`` = the recorded motor
  command u in [-1, 1]. ``dyntype=integrator`` makes the activation the winch
  integral ``a = ∫u dt`` (s), so the rest length is ``λ = λ0 - s·ω_max·r·a``
  (``a`` limited to the winch's rest-length range); the gain/bias give the
  tension-only spring-damper ``-k·(L - λ) - c·L̇`` clamped to pulling
  (``forcerange``); the actuator's ``delay`` (history buffer, linear
  interpolation) is the control latency;
* the passive tendons as tendon springs with a dead band ``[0, L0]`` (tension only,
  linear: the engine's nominal cubic term is zero) and tendon damping;
* one ``framepos`` sensor per end cap (the observation, 18 values).

What the native model cannot express: the motor's first-order speed lag (it shows
up as extra latency), a nonlinear (cubic) passive stiffness, damping cut off when a
cable is slack, and per-motor speed spread (one shared speed is fitted, as the
engine does; its truth is the mean). The initial state is the model settled at
rest with the start values, moved rigidly onto the first observed end caps.

Standalone: ``python -m benchmarks.sysid_mujoco [--quick]`` runs a random policy
on the twin (ground-truth end caps at the camera rate stand in for the tracker),
fits, and prints one JSON object (last line of stdout).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Literal

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco
import numpy as np
import pandas as pd
from scipy.spatial.transform import Rotation

from pipeline.config import RobotConfig, TwinConfig, load_all
from pipeline.control import PID, REST_LENGTH_LIMITS_M
from pipeline.hardware.base import GroundTruthPacket, SensorPacket
from pipeline.hardware.twin import MujocoTwin
from pipeline.hardware.twin_model import build_twin_xml
from pipeline.learned.simulated import MUJOCO_ROLLING_FRICTION, MUJOCO_TORSIONAL_FRICTION
from pipeline.physics.params import robot_values
from pipeline.policies import REST_TARGET, random_policy
from pipeline.robot_model import N_ACTUATED, N_CABLES, N_CAPS, length_to_target, target_to_length
from pipeline.truth import twin_true_params
from storage.trajectory import CABLE_COLS, CAP_COLS, CONTROL_COLS, TARGET_COLS

try:
    from mujoco import sysid
except ImportError:  # pragma: no cover - depends on the installed extras
    sysid = None

BOUNDS: dict[str, tuple[float, float]] = {
    "friction": (0.05, 2.0),
    "motor_speed": (0.3, 2.0),
    "latency_s": (0.0, 0.2),
    "actuated_stiffness": (10.0, 500.0),
    "actuated_damping": (0.0, 10.0),
    "passive_stiffness": (2.0, 200.0),
    "passive_cubic_stiffness": (0.0, 2000.0),
    "passive_damping": (0.0, 10.0),
}
"""Parameters the native model expresses, with their search bounds (SI; speed is the
dimensionless s in omega = s * omega_max * u, latency in s)."""

DEFAULT_PARAMETERS = ("friction", "motor_speed", "latency_s")
MUJOCO_DEFAULT_FRICTION = (MUJOCO_TORSIONAL_FRICTION, MUJOCO_ROLLING_FRICTION)
"""Torsional and rolling friction coefficients (MuJoCo's defaults; the engine has neither)."""

_ZOH_EPS_S = 1e-9


NATIVE_PARAMETERS = (
    "friction",
    "motor_speed",
    "actuated_stiffness",
    "actuated_damping",
    "passive_stiffness",
    "passive_cubic_stiffness",
    "passive_damping",
)
"""Engine parameters the native model also has (plus ``latency_s``)."""


def nominal_values(robot: RobotConfig) -> dict[str, float]:
    """The pipeline's prior for every parameter in :data:`BOUNDS` (robot config, SI)."""
    values = robot_values(robot)
    return {**{n: values[n] for n in NATIVE_PARAMETERS}, "latency_s": robot.pid.latency_s}


def true_values(robot: RobotConfig, twin: TwinConfig) -> dict[str, float]:
    """The twin's hidden values of the parameters in :data:`BOUNDS` (evaluation only).

    As :func:`pipeline.truth.twin_true_params` (the motor speed is the mean over the
    six motors, against the robot config's ``omega_max``); the latency is the control latency
    alone (the twin's motor lag ``time_constant_s`` adds to the delay the native model sees).
    """
    truth = twin_true_params(robot, twin)
    return {**{n: float(getattr(truth, n)[0]) for n in NATIVE_PARAMETERS}, "latency_s": twin.control_latency_s}


def native_spec(robot: RobotConfig, twin: TwinConfig) -> mujoco.MjSpec:
    """MJCF-native model of the robot (see the module docstring), parameters unset.

    Only the twin's geometry and physics settings (time step, gravity, camera) are
    taken from ``twin``: its hidden values are replaced by the robot config's.
    """
    known = twin.model_copy(
        update={
            "ground": twin.ground.model_copy(
                update={
                    "friction_sliding": robot.ground.friction,
                    "friction_torsional": MUJOCO_DEFAULT_FRICTION[0],
                    "friction_rolling": MUJOCO_DEFAULT_FRICTION[1],
                }
            ),
            "attachment_phase_rad": robot.attachment.phase_rad,
        }
    )
    spec = mujoco.MjSpec.from_string(build_twin_xml(robot, known).xml)
    for actuator in list(spec.actuators):
        spec.delete(actuator)
    max_delay_steps = int(np.ceil(BOUNDS["latency_s"][1] / twin.physics.timestep_s)) + 2
    for i in range(N_ACTUATED):
        actuator = spec.add_actuator(name=f"winch{i}", target=f"cable{i}")
        actuator.trntype = mujoco.mjtTrn.mjTRN_TENDON
        actuator.dyntype = mujoco.mjtDyn.mjDYN_INTEGRATOR
        actuator.gaintype = mujoco.mjtGain.mjGAIN_FIXED
        actuator.biastype = mujoco.mjtBias.mjBIAS_AFFINE
        actuator.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        actuator.ctrlrange = [-1.0, 1.0]
        actuator.actlimited = mujoco.mjtLimited.mjLIMITED_TRUE
        actuator.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
        actuator.forcerange = [-1e6, 0.0]
        actuator.nsample = max_delay_steps
        actuator.interp = 1
    for i in range(N_CAPS):
        spec.add_sensor(
            name=f"cap{i}",
            type=mujoco.mjtSensor.mjSENS_FRAMEPOS,
            objtype=mujoco.mjtObj.mjOBJ_GEOM,
            objname=f"cap{i}",
        )
    apply_values(spec, robot, nominal_values(robot), target_to_length(robot, REST_TARGET))
    return spec


def apply_values(
    spec: mujoco.MjSpec, robot: RobotConfig, values: Mapping[str, float], rest_length_m: np.ndarray
) -> None:
    """Write parameter ``values`` (names of :data:`BOUNDS`, SI) into the native ``spec``.

    Winch ``i``: activation a = ∫u dt (s), rest length λ = λ0 - v·a with
    λ0 = ``rest_length_m[i]`` (m, at a = 0) and v = s·ω_max·r (m/s); tendon force
    = gain·a + bias0 + bias1·L + bias2·L̇ = -k·(L - λ0 + v·a) - c·L̇, clamped to pulling.
    """
    for geom in spec.geoms:
        geom.friction = [values["friction"], *MUJOCO_DEFAULT_FRICTION]
    rate = values["motor_speed"] * robot.motor.omega_max_rad_s * robot.motor.winch_radius_m
    k, c = values["actuated_stiffness"], values["actuated_damping"]
    rest0 = rest_length_m
    lo, hi = REST_LENGTH_LIMITS_M
    for i in range(N_ACTUATED):
        actuator = spec.actuator(f"winch{i}")
        actuator.gainprm[0] = -k * rate
        actuator.biasprm[:3] = [k * rest0[i], -k, -c]
        actuator.actrange = [(rest0[i] - hi) / rate, (rest0[i] - lo) / rate]
        actuator.delay = values["latency_s"]
    for i in range(N_ACTUATED, N_CABLES):
        tendon = spec.tendon(f"cable{i}")
        tendon.stiffness = [values["passive_stiffness"], 0.0, values["passive_cubic_stiffness"]]
        tendon.springlength = [0.0, robot.passive_cable.rest_length_m]
        tendon.damping = [values["passive_damping"], 0.0, 0.0]


def _zoh_series(times_s: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Encode a zero-order-hold signal so linear interpolation reproduces it.

    ``times_s`` (n,) switch times, ``values`` (n, k): returns (2n-1,) times and
    (2n-1, k) values with a knot ``_ZOH_EPS_S`` before every switch.
    """
    before = times_s[1:] - _ZOH_EPS_S
    t = np.empty(2 * len(times_s) - 1)
    t[0::2], t[1::2] = times_s, before
    v = np.empty((len(t), values.shape[1]))
    v[0::2], v[1::2] = values, values[:-1]
    return t, v


def _settle(
    spec: mujoco.MjSpec, robot: RobotConfig, values: Mapping[str, float], settle_s: float, caps0_m: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Bring the model to the robot's rest state as the hardware does, then align it.

    From the model's resting pose the cable-length PID holds ``REST_TARGET`` for
    ``settle_s`` s; the settled pose is then moved rigidly so its end caps best match
    the first observation ``caps0_m`` (6, 3) m. Returns (the settled winch rest
    lengths (6,) m, the ``mjSTATE_FULLPHYSICS`` initial state with zero winch
    activation and empty command history) for :func:`apply_values`.
    """
    rest0 = target_to_length(robot, REST_TARGET)
    apply_values(spec, robot, values, rest0)
    model = spec.compile()
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    pid = PID(robot.pid)
    steps_per_tick = max(1, round(1.0 / (robot.pid.control_rate_hz * model.opt.timestep)))
    for _ in range(round(settle_s * robot.pid.control_rate_hz)):
        data.ctrl[:] = pid.step(length_to_target(robot, data.ten_length[:N_ACTUATED]), REST_TARGET)
        for _ in range(steps_per_tick):
            mujoco.mj_step(model, data)
    rate = values["motor_speed"] * robot.motor.omega_max_rad_s * robot.motor.winch_radius_m
    rest = rest0 - rate * data.act[:N_ACTUATED]
    caps = np.array([data.geom_xpos[model.geom(f"cap{i}").id] for i in range(N_CAPS)])
    rotation, _ = Rotation.align_vectors(caps0_m - caps0_m.mean(0), caps - caps.mean(0))
    shift = caps0_m.mean(0) - rotation.apply(caps.mean(0))
    qpos = data.qpos.copy()
    for joint in range(model.njnt):
        adr = model.jnt_qposadr[joint]
        qpos[adr : adr + 3] = rotation.apply(qpos[adr : adr + 3]) + shift
        quat = Rotation.from_quat(qpos[adr + 3 : adr + 7], scalar_first=True)
        qpos[adr + 3 : adr + 7] = (rotation * quat).as_quat(scalar_first=True)
    return rest, sysid.create_initial_state(model, qpos)


def _measured(
    model: mujoco.MjModel, hardware_df: pd.DataFrame, caps_df: pd.DataFrame, input_cols: list[str]
) -> tuple[sysid.TimeSeries, sysid.TimeSeries, np.ndarray]:
    """System input ``input_cols`` (zero-order hold) and end-cap sensors as TimeSeries, from t = 0.

    Returns (input, sensordata, first observed caps (6, 3) m).
    """
    hw = hardware_df.sort_values("t")
    t0 = float(hw["t"].iloc[0])
    t_ctrl = hw["t"].to_numpy() - t0
    caps = caps_df.sort_values("t")
    t_caps = caps["t"].to_numpy() - t0
    keep = (t_caps >= 0.0) & (t_caps <= t_ctrl[-1])
    cap_xyz = caps[CAP_COLS].to_numpy()[keep]
    t_zoh, u_zoh = _zoh_series(t_ctrl, hw[input_cols].to_numpy())
    control = sysid.TimeSeries.from_control_names(t_zoh, u_zoh, model)
    sensordata = sysid.TimeSeries.from_names(t_caps[keep], cap_xyz, model)
    return control, sensordata, cap_xyz[0].reshape(N_CAPS, 3)


def closed_loop_rollout(robot: RobotConfig, tick_s: np.ndarray, targets: np.ndarray) -> sysid.CustomRolloutFn:
    """A ``mujoco.sysid`` custom rollout that replays the *targets* through the robot's PID.

    ``tick_s`` (n,) control tick times (s, from 0) and ``targets`` (n, 6) the
    recorded targets at each tick. Every tick the PID (the robot firmware's, reset
    when the target changes) reads the model's actuated cable lengths and sets the
    winch commands, which the model's actuators delay natively; between ticks the
    model steps freely. States and sensors are recorded once per tick.
    """
    state_kind = mujoco.mjtState.mjSTATE_FULLPHYSICS

    def rollout(
        *,
        models: Sequence[mujoco.MjModel],
        datas: Sequence[mujoco.MjData],
        initial_states: Sequence[np.ndarray],
        rollout_signal_mapping: dict,
        rollout_state_mapping: dict,
        ctrl_mapping: dict,
        **_: object,
    ) -> list[sysid.SystemTrajectory]:
        out = []
        data = datas[0]
        for model, initial_state in zip(models, initial_states, strict=True):
            n_steps = max(1, round(1.0 / (robot.pid.control_rate_hz * model.opt.timestep)))
            mujoco.mj_setState(model, data, initial_state, state_kind)
            mujoco.mj_forward(model, data)
            pid = PID(robot.pid)
            states = np.empty((len(tick_s), mujoco.mj_stateSize(model, state_kind)))
            sensors = np.empty((len(tick_s), model.nsensordata))
            commands = np.empty((len(tick_s), N_ACTUATED))
            for k, target in enumerate(targets):
                if k > 0 and not np.array_equal(target, targets[k - 1]):
                    pid.reset()
                commands[k] = pid.step(length_to_target(robot, data.ten_length[:N_ACTUATED]), target)
                data.ctrl[:] = commands[k]
                mujoco.mj_step(model, data, nstep=n_steps)
                mujoco.mj_getState(model, data, states[k], state_kind)
                sensors[k] = data.sensordata
            times = states[:, 0]
            out.append(
                sysid.SystemTrajectory(
                    model=model,
                    control=sysid.TimeSeries(tick_s, commands, ctrl_mapping),
                    sensordata=sysid.TimeSeries(times, sensors, rollout_signal_mapping),
                    initial_state=initial_state,
                    state=sysid.TimeSeries(times, states, rollout_state_mapping),
                )
            )
        return out

    return rollout


def _not_run(reason: str, parameters: Sequence[str]) -> dict[str, object]:
    return {"status": reason, "method": "mujoco.sysid", "parameters": list(parameters)}


def mujoco_sysid_anchor(
    robot: RobotConfig,
    twin: TwinConfig,
    hardware_df: pd.DataFrame,
    caps_df: pd.DataFrame,
    max_seconds: float = 120.0,
    start: Mapping[str, float] | None = None,
    parameters: Sequence[str] = DEFAULT_PARAMETERS,
    replay: Literal["closed_loop", "open_loop"] = "closed_loop",
    fd_step: float = 1e-2,
    n_threads: int = 2,
) -> dict[str, object]:
    """Identify ``parameters`` from one recorded trajectory with ``mujoco.sysid``.

    ``hardware_df``: the hardware trajectory (``t`` s, ``control_0..5`` in [-1, 1]);
    ``caps_df``: observed end caps (``t`` s on the same clock, ``cap{i}_x/_y/_z`` m).
    ``start`` overrides the starting values (default: robot config nominal values,
    friction 0.5); parameters not fitted keep their nominal values. ``twin`` gives
    the model's geometry and physics settings, and the truth for the error figures.
    ``max_seconds`` caps the optimiser's iterations from the measured cost of one
    iteration (a started iteration is finished). ``replay``: ``"open_loop"`` feeds the
    recorded commands to the native actuators through the toolbox's default rollout
    (``mujoco.rollout``, ``n_threads`` threads); ``"closed_loop"`` feeds the recorded
    targets through the robot's PID on the model's own cable lengths
    (:func:`closed_loop_rollout`, one thread), as the hardware ran. ``fd_step``: the
    finite-difference step (absolute, in each parameter's unit): contact and the PID
    dead band make the residual rough at small scales, so it is large. A parameter
    starting on a bound is moved 5 % inside (``move_off_bounds``).

    Returns a JSON-able dict: ``status`` ("ok" or why it could not run), ``identified``,
    ``start``, ``truth``, ``abs_error`` and ``rel_error`` by parameter, ``wall_s``,
    ``iterations``, ``rollouts`` (trajectory simulations), the normalised residual
    cost before/after, the cap position RMSE (m) before/after, and the rollout
    description.
    """
    if sysid is None:
        return _not_run("mujoco.sysid unavailable: install mujoco[sysid] (absl-py, tabulate, ...)", parameters)
    unknown = set(parameters) - set(BOUNDS)
    if unknown:
        return _not_run(f"parameters {sorted(unknown)} not expressible; known: {sorted(BOUNDS)}", parameters)
    began = time.perf_counter()
    values = nominal_values(robot) | {"friction": 0.5} | dict(start or {})
    spec = native_spec(robot, twin)
    input_cols = TARGET_COLS if replay == "closed_loop" else CONTROL_COLS
    control, sensordata, caps0 = _measured(spec.compile(), hardware_df, caps_df, input_cols)
    rest_length, initial_state = _settle(spec, robot, values, twin.settle_s, caps0)
    apply_values(spec, robot, values, rest_length)
    sequences = sysid.ModelSequences("tribar", spec, "trajectory", initial_state, control, sensordata)

    params = sysid.ParameterDict(
        {name: sysid.Parameter(name, values[name], *BOUNDS[name]) for name in parameters}
    ).move_off_bounds()
    fixed = {k: v for k, v in values.items() if k not in parameters}
    rollouts = 0

    def build_model(candidate: sysid.ParameterDict, spec_: mujoco.MjSpec) -> mujoco.MjModel:
        nonlocal rollouts
        rollouts += 1
        apply_values(spec_, robot, fixed | {k: float(p.value[0]) for k, p in candidate.items()}, rest_length)
        return spec_.compile()

    custom_rollout = None
    if replay == "closed_loop":
        hw = hardware_df.sort_values("t")
        tick_s = hw["t"].to_numpy() - float(hw["t"].iloc[0])
        keep = tick_s <= control.times[-1]
        custom_rollout = closed_loop_rollout(robot, tick_s[keep], hw[TARGET_COLS].to_numpy()[keep])
    residual_fn = sysid.build_residual_fn(
        models_sequences=[sequences],
        build_model=build_model,
        custom_rollout=custom_rollout,
        n_threads=1 if custom_rollout else max(1, n_threads),
    )

    def cost_and_rmse(x: np.ndarray) -> tuple[float, float]:
        residuals, predicted, measured = residual_fn(x, params.copy(), return_pred_all=True)
        r = np.concatenate(residuals)
        error = measured[0][0].data - predicted[0][0].data
        return 0.5 * float(r @ r), float(np.sqrt(np.mean(error**2)))

    x0 = params.as_vector()
    probe = time.perf_counter()
    cost0, rmse0 = cost_and_rmse(x0)
    per_rollout_s = time.perf_counter() - probe
    # one iteration: a Jacobian (one rollout per parameter) and about two trial points
    per_iteration_s = per_rollout_s * (len(parameters) + 2)
    budget_s = max_seconds - (time.perf_counter() - began) - per_rollout_s
    max_iters = int(budget_s // per_iteration_s)
    if max_iters < 1:
        return _not_run(
            f"max_seconds = {max_seconds} s too short: one iteration takes about {per_iteration_s:.1f} s", parameters
        ) | {"wall_s": time.perf_counter() - began}
    fitted, result = sysid.optimize(
        params,
        residual_fn,
        optimizer="mujoco",
        verbose=False,
        output=io.StringIO(),
        max_iters=max_iters,
        eps=fd_step,
        x_scale=np.array([BOUNDS[name][1] - BOUNDS[name][0] for name in parameters]),
    )
    cost1, rmse1 = cost_and_rmse(fitted.as_vector())
    wall = time.perf_counter() - began
    truth = true_values(robot, twin)
    identified = {name: float(fitted[name].value[0]) for name in parameters}
    return {
        "status": "ok",
        "method": "mujoco.sysid.optimize (optimizer='mujoco': box-bounded Gauss-Newton, finite differences)",
        "rollout": {
            "closed_loop": "MJCF-native cable/winch model; recorded targets through the robot PID (custom rollout)",
            "open_loop": "MJCF-native cable/winch model; recorded commands replayed open loop by mujoco.rollout",
        }[replay],
        "parameters": list(parameters),
        "start": {name: float(params[name].value[0]) for name in parameters},
        "identified": identified,
        "truth": {name: truth[name] for name in parameters},
        "abs_error": {name: abs(identified[name] - truth[name]) for name in parameters},
        "rel_error": {name: abs(identified[name] - truth[name]) / abs(truth[name]) for name in parameters},
        "wall_s": wall,
        "iterations": len(result.extras["objective"]),
        "max_iters": max_iters,
        "rollouts": rollouts,
        "cost_start": cost0,
        "cost_final": cost1,
        "cap_rmse_start_m": rmse0,
        "cap_rmse_final_m": rmse1,
        "trajectory_s": float(control.times[-1]),
        "n_observations": len(sensordata),
    }


def twin_recording(
    robot: RobotConfig, twin: TwinConfig, n_targets: int, seed: int, segment_timeout_s: float = 8.0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run a random policy on the twin: (hardware frame at the control rate with sensed cable
    lengths, ground-truth end caps subsampled to the camera rate) with the trajectory
    contract's columns."""
    hardware, caps = [], []
    twin_robot = MujocoTwin(robot, twin)
    for packet in twin_robot.execute(random_policy(robot, n_targets, seed), segment_timeout_s, record_frames=False):
        if isinstance(packet, SensorPacket):
            row = {"t": packet.t_s, "segment": packet.segment}
            row.update(zip(TARGET_COLS, packet.target, strict=True))
            row.update(zip(CONTROL_COLS, packet.control, strict=True))
            row.update(zip(CABLE_COLS, packet.cable_m, strict=True))
            hardware.append(row)
        elif isinstance(packet, GroundTruthPacket):
            caps.append({"t": packet.t_s, **dict(zip(CAP_COLS, packet.caps_m.ravel(), strict=True))})
    twin_robot.close()
    every = max(1, round(robot.pid.control_rate_hz / twin.camera.rate_hz))
    return pd.DataFrame(hardware), pd.DataFrame(caps).iloc[::every].reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short trajectory, 30 s budget")
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--n-targets", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--parameters", default=",".join(DEFAULT_PARAMETERS))
    parser.add_argument("--replay", choices=("closed_loop", "open_loop"), default="closed_loop")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    configs = load_all(args.config)
    n_targets = 3 if args.quick else args.n_targets
    generated = time.perf_counter()
    hardware_df, caps_df = twin_recording(configs.robot, configs.twin, n_targets, args.seed)
    generate_s = time.perf_counter() - generated
    result = mujoco_sysid_anchor(
        configs.robot,
        configs.twin,
        hardware_df,
        caps_df,
        max_seconds=30.0 if args.quick else args.max_seconds,
        parameters=tuple(args.parameters.split(",")),
        replay=args.replay,
    )
    print(json.dumps(result | {"data": {"n_targets": n_targets, "seed": args.seed, "generate_s": generate_s}}))


if __name__ == "__main__":
    main()
