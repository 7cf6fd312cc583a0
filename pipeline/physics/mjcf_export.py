"""Export a robot config (nominal or identified) as a self-contained MuJoCo model (MJCF).

:func:`identified_mjcf` returns MJCF text that ``mujoco.MjModel.from_xml_string`` loads and
``mujoco.mj_step`` simulates with no Python callbacks (unlike the twin, whose cable forces are
computed in Python). SI units throughout (m, kg, s, N, rad). Mapping of the robot config:

* **Rods**: free bodies ``rod0..2`` built as the twin builds them
  (:func:`~pipeline.hardware.twin_model.rod_bodies_xml`): capsule, end-cap spheres ``cap0..5``,
  motor cylinders, masses from the config (MuJoCo derives the inertia from the geoms). Cable ends
  are sites on the cap surfaces at the config's attachment phases.
* **Passive cables 6..8**: spatial tendons with ``springlength="0 L"`` (no force while shorter
  than the rest length ``L = passive_cable.rest_length_m``: tension-only), polynomial stiffness
  ``"k 0 k3"`` (N/m, N/m^3: tension ``k x + k3 x^3`` for stretch ``x``, exactly the engine's law)
  and damping ``b`` (N s/m). Limit: MuJoCo's tendon damping has no dead band, so a slack passive
  cable that changes length is still damped.
* **Actuated cables 0..5**: spatial tendons without passive force; each is driven by a
  ``general`` actuator of the same name modelling cable and winch together:

  - ``dyntype="integrator"``: the activation ``act`` (m) is the change of the cable's rest
    length from its value in the rest pose, ``L0 = biasprm[0] / gainprm[0]``; the rest length is
    ``L0 + act``, limited by ``actrange`` to :data:`~pipeline.control.REST_LENGTH_LIMITS_M`.
  - ``ctrl`` (m/s) is the rest length's rate: ``ctrl = -u * v_max`` for the firmware's motor
    command ``u`` in [-1, 1] (``u > 0`` winds in), with ``ctrlrange = [-v_max, v_max]`` and
    ``v_max = motor.speed * motor.omega_max_rad_s * motor.winch_radius_m`` (hybrid-GNN paper App. C).
    ``ctrl = 0`` holds the cable. The motor's speed lag (``motor.time_constant_s``) is not modelled.
  - force (N, along the tendon) ``k * act + k * L0 - k * length - b * velocity``
    (``gainprm = k``, ``biasprm = [k L0, -k, -b]``), clamped by ``forcerange = [-F, 0]``: a cable
    only pulls (tension ``k * stretch + b * stretch rate``, zero once that would push).
  - the identified control latency ``pid.latency_s`` becomes the actuator ``delay`` (``ctrl`` is
    applied that much later).
* **Ground**: a plane; every geom has Coulomb friction ``ground.friction`` (``condim="3"``, elliptic
  cone, no torsional or rolling friction, as the engine; ``noslip_iterations`` remove the slow creep
  of MuJoCo's soft friction under the prestressed robot's steady sideways contact forces, so it
  stays put at rest as the engine's sticking friction does). Restitution ``e`` maps to a direct
  ``solref = (-K, -B)`` contact spring-damper with ``K = w^2`` (1/s^2) and ``B = 2 z w`` (1/s), where
  ``w`` is :data:`CONTACT_FREQUENCY_RAD_S` (lowered to ``0.25 / timestep`` for long steps) and
  ``z = -ln e / sqrt(pi^2 + ln^2 e)`` (``z = 1`` for ``e = 0``), the damping ratio of a linear
  oscillator whose rebound speed is ``e`` times its impact speed. Limits: MuJoCo contacts are soft
  (the resting end caps sink about 0.5 mm with the default ``solimp``); an end cap dropped at
  1 m/s rebounds within about 0.04 of ``e`` for ``e >= 0.2`` (timestep <= 5 ms), but weak rebounds
  are damped out (hardly any for ``e <= 0.1`` at 1 m/s, or ``e <= 0.2`` at 0.3 m/s): slower
  impacts and longer timesteps rebound less.
* **Gravity** ``-gravity_m_s2`` along z; **timestep** ``timestep_s`` (pass the engine's ``dt``),
  ``implicitfast`` integrator.
* **Keyframe** ``rest``: the robot at rest on face (0, 2, 5), as the twin starts. Each actuated
  rest length ``L0`` holds the config's reference prism in static equilibrium
  (:func:`~pipeline.physics.statics.equilibrium_rest_lengths`); the model is then settled for
  :data:`SETTLE_S` in MuJoCo and the settled pose is both the keyframe and the bodies' initial
  pose, so ``mj_resetData`` and ``mj_resetDataKeyframe(model, data, 0)`` both start at rest. On the
  twin's hidden values it lies within about 1.5 cm of the twin's settled pose (whose PID stops
  anywhere inside its tolerance band).
"""

from __future__ import annotations

import logging
import math

import mujoco
import numpy as np

from pipeline.config import RobotConfig
from pipeline.control import REST_LENGTH_LIMITS_M
from pipeline.hardware.twin_model import FLOOR_ASSET, rod_bodies_xml
from pipeline.physics.engine import Engine
from pipeline.physics.model import RobotModel
from pipeline.physics.params import Params
from pipeline.physics.rollout import state_from_caps
from pipeline.robot_model import (
    N_ACTUATED,
    Cable,
    build_cables,
    quat_to_rotation,
    reference_prism,
    resting_on_face,
    rod_frames,
    rotation_to_quat,
)

log = logging.getLogger(__name__)

DEFAULT_TIMESTEP_S = 0.002
"""Timestep (s) when none is given."""
CONTACT_FREQUENCY_RAD_S = 50.0
"""Natural frequency of the ground contact's spring (rad/s): MuJoCo's default time constant,
0.02 s, at critical damping."""
MAX_TENSION_N = 1.0e4
"""Force limit of the actuated cables (N): far above any tension of the robot."""
SETTLE_S = 3.0
"""Simulated time (s) the rest pose is settled in MuJoCo before it becomes the keyframe."""
SETTLED_QVEL = 3e-2
"""Largest |qvel| (m/s, rad/s) of a settled rest pose; above it a warning is logged."""
DIVERGED_QVEL = 10.0
"""|qvel| (m/s, rad/s) above which settling counts as diverged."""
MAX_HALVINGS = 4
"""How many times :func:`identified_mjcf` halves a timestep at which the model diverges."""


def restitution_damping_ratio(restitution: float) -> float:
    """Damping ratio (1) of a linear spring-damper whose rebound speed is ``restitution`` times its
    impact speed: ``-ln e / sqrt(pi^2 + ln^2 e)``, 1 (critical) for ``e = 0``, 0 for ``e = 1``."""
    if not 0.0 <= restitution <= 1.0:
        raise ValueError(f"restitution must be in [0, 1], got {restitution}")
    if restitution == 0.0:
        return 1.0
    log_e = math.log(restitution)
    return -log_e / math.sqrt(math.pi**2 + log_e**2)


def contact_solref(restitution: float, timestep_s: float) -> tuple[float, float]:
    """Direct-format ``solref`` (-stiffness 1/s^2, -damping 1/s) of the ground contact."""
    omega = min(CONTACT_FREQUENCY_RAD_S, 0.25 / timestep_s)
    return -(omega**2), -2.0 * restitution_damping_ratio(restitution) * omega


def actuated_speed_m_s(robot: RobotConfig) -> float:
    """Largest rate of change (m/s) of an actuated cable's rest length: ``speed * omega_max * r``."""
    return robot.motor.speed * robot.motor.omega_max_rad_s * robot.motor.winch_radius_m


def _fmt(values) -> str:
    return " ".join(f"{float(v):.9g}" for v in np.ravel(values))


def _rest_lengths(robot: RobotConfig, caps: np.ndarray, gravity_m_s2: float) -> np.ndarray:
    """Actuated rest lengths (6,) m holding end caps ``caps`` (6, 3) in static equilibrium."""
    engine = Engine(RobotModel.from_robot(robot), gravity_m_s2=gravity_m_s2)
    state = state_from_caps(engine, Params.from_robot(robot), caps)
    return state.rest_length[0].numpy().astype(float)


def _model_xml(
    robot: RobotConfig,
    cables: list[Cable],
    rod_pos_m: np.ndarray,
    rod_quat: np.ndarray,
    rest_length_m: np.ndarray,
    timestep_s: float,
    gravity_m_s2: float,
) -> str:
    """The MJCF with the rods at ``rod_pos_m`` (3, 3) and ``rod_quat`` (3, 4) (w, x, y, z), the
    actuated cables' rest-pose rest lengths ``rest_length_m`` (6,) and a ``rest`` keyframe there."""
    bodies = rod_bodies_xml(robot, cables, rod_pos_m, quat_to_rotation(rod_quat))
    stiffness, damping = contact_solref(robot.ground.restitution, timestep_s)
    passive = robot.passive_cable
    k, b = robot.actuated_cable.stiffness_n_per_m, robot.actuated_cable.damping_n_s_per_m
    speed = actuated_speed_m_s(robot)
    latency_s = robot.pid.latency_s
    delay = f' nsample="{math.ceil(latency_s / timestep_s) + 1}" delay="{latency_s:.9g}"' if latency_s > 0 else ""
    tendons, actuators = [], []
    for c in cables:
        path = f'<site site="cable{c.index}_a"/><site site="cable{c.index}_b"/>'
        if c.actuated:
            tendons.append(f'    <spatial name="cable{c.index}" width="0.0015" rgba="0.9 0.9 0.9 1">{path}</spatial>')
            rest = rest_length_m[c.index]
            act_range = (REST_LENGTH_LIMITS_M[0] - rest, REST_LENGTH_LIMITS_M[1] - rest)
            actuators.append(
                f'    <general name="cable{c.index}" tendon="cable{c.index}" dyntype="integrator" '
                f'gaintype="fixed" gainprm="{k:.9g}" biastype="affine" biasprm="{_fmt([k * rest, -k, -b])}"\n'
                f'             ctrlrange="{-speed:.9g} {speed:.9g}" actrange="{_fmt(act_range)}" '
                f'forcerange="{-MAX_TENSION_N:.9g} 0"{delay}/>'
            )
        else:
            tendons.append(
                f'    <spatial name="cable{c.index}" width="0.0015" rgba="0.6 0.6 0.6 1" '
                f'stiffness="{_fmt([passive.stiffness_n_per_m, 0.0, passive.cubic_stiffness_n_per_m3])}" '
                f'damping="{passive.damping_n_s_per_m:.9g}" springlength="0 {passive.rest_length_m:.9g}">'
                f"{path}</spatial>"
            )
    qpos = np.concatenate([np.r_[p, q] for p, q in zip(rod_pos_m, rod_quat, strict=True)])
    mu = robot.ground.friction
    return f"""<mujoco model="{robot.name}_identified">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{timestep_s:.9g}" gravity="0 0 {-gravity_m_s2:.9g}" integrator="implicitfast" cone="elliptic"
          noslip_iterations="3"/>
  <default>
    <geom condim="3" friction="{mu:.9g} 0 0" solref="{stiffness:.9g} {damping:.9g}"/>
  </default>
{FLOOR_ASSET}  <worldbody>
    <light name="sun" directional="true" pos="0 0 4" dir="0.2 0.3 -1" diffuse="0.8 0.8 0.8"/>
    <geom name="ground" type="plane" size="0 0 1" material="floor"/>
{bodies}
  </worldbody>
  <tendon>
{chr(10).join(tendons)}
  </tendon>
  <actuator>
{chr(10).join(actuators)}
  </actuator>
  <keyframe>
    <key name="rest" qpos="{_fmt(qpos)}" act="{_fmt(np.zeros(N_ACTUATED))}" ctrl="{_fmt(np.zeros(N_ACTUATED))}"/>
  </keyframe>
</mujoco>
"""


def identified_mjcf(robot: RobotConfig, timestep_s: float = DEFAULT_TIMESTEP_S, gravity_m_s2: float = 9.81) -> str:
    """Self-contained MJCF of ``robot`` (e.g. the robot config with the sysid overlay) resting on
    face (0, 2, 5); see the module docstring for how each value maps. ``timestep_s`` (s) is the
    model's physics step (halved, with a warning, while the model diverges at it, e.g. for very
    stiff cables), ``gravity_m_s2`` (m/s^2) the magnitude of gravity."""
    if timestep_s <= 0:
        raise ValueError(f"timestep_s must be > 0, got {timestep_s}")
    caps = resting_on_face(robot, reference_prism(robot))
    centres, rotations = rod_frames(robot, caps)
    cables = build_cables(robot, robot.attachment.phase_rad)
    rest = _rest_lengths(robot, caps, gravity_m_s2)
    quats = np.array([rotation_to_quat(r) for r in rotations])
    for _ in range(MAX_HALVINGS + 1):
        xml = _model_xml(robot, cables, centres, quats, rest, timestep_s, gravity_m_s2)
        qpos = _settled_qpos(mujoco.MjModel.from_xml_string(xml), robot.name)
        if qpos is not None:
            return _model_xml(robot, cables, qpos[:, :3], qpos[:, 3:], rest, timestep_s, gravity_m_s2)
        log.warning("robot '%s': MuJoCo model diverges at timestep %.3g s; halving it", robot.name, timestep_s)
        timestep_s /= 2
    raise ValueError(f"robot '{robot.name}': the MuJoCo model diverges even at timestep {2 * timestep_s:.3g} s")


def _settled_qpos(model: mujoco.MjModel, name: str) -> np.ndarray | None:
    """Rod poses (3, 7) (position m, quaternion w, x, y, z) after :data:`SETTLE_S` from the ``rest``
    keyframe; None if the simulation diverged."""
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, 0)
    for _ in range(round(SETTLE_S / model.opt.timestep)):
        mujoco.mj_step(model, data)
    speed = float(np.abs(data.qvel).max())
    if data.warning[mujoco.mjtWarning.mjWARN_BADQACC].number > 0 or not np.isfinite(speed) or speed > DIVERGED_QVEL:
        return None
    if speed > SETTLED_QVEL:
        log.warning("robot '%s': MuJoCo rest pose not settled after %.1f s (max |qvel| = %.3g)", name, SETTLE_S, speed)
    return data.qpos.reshape(3, 7).copy()
