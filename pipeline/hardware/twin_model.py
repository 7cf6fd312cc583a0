"""Build the MuJoCo model (MJCF) of the twin from the robot and hidden hardware configs.

Each rod is a free body made of a thin capsule, two end-cap spheres (red, green or
blue per rod) and two motor cylinders. Every cable is a spatial tendon between two
sites on end-cap surfaces, driven by a force actuator whose control is the
(negative) cable tension computed by the twin each physics step, so that cables are
tension-only and passive tendons can be nonlinear.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import CameraConfig, RobotConfig, TwinConfig
from pipeline.robot_model import (
    Cable,
    build_cables,
    reference_prism,
    resting_on_face,
    rod_frames,
    rotation_to_quat,
)

FLOOR_ASSET = """\
  <asset>
    <texture name="floor" type="2d" builtin="checker" rgb1="0.55 0.55 0.52" rgb2="0.6 0.6 0.57"
             width="256" height="256"/>
    <material name="floor" texture="floor" texrepeat="8 8"/>
  </asset>
"""
"""MJCF ``<asset>`` of the checkered floor material (``floor``), shared by the twin and the export."""

ROD_COLOURS = ((0.9, 0.05, 0.05, 1.0), (0.05, 0.8, 0.1, 1.0), (0.05, 0.15, 0.95, 1.0))


@dataclass(frozen=True)
class TwinModelSpec:
    """The MJCF text plus what the twin needs to map model indices to the robot."""

    xml: str
    cables: list[Cable]
    initial_rod_pos_m: np.ndarray
    initial_rod_quat: np.ndarray


def _fmt(values) -> str:
    return " ".join(f"{float(v):.9g}" for v in np.ravel(values))


def camera_axes(camera: CameraConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right, up and forward unit vectors (world) of a camera looking at ``look_at_m``."""
    position = np.asarray(camera.position_m, float)
    forward = np.asarray(camera.look_at_m, float) - position
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    if np.linalg.norm(right) < 1e-9:
        right = np.array([1.0, 0.0, 0.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    return right, up, forward


def rod_bodies_xml(robot: RobotConfig, cables: list[Cable], centres: np.ndarray, rotations: np.ndarray) -> str:
    """MJCF ``<body>`` elements of the three rods, each a free body at ``centres`` (3, 3) m with
    orientation ``rotations`` (3, 3, 3): a capsule, two end-cap spheres (``cap<i>``), two motor
    cylinders and a site ``cable<j>_a``/``cable<j>_b`` at each cable end on it. Masses (kg) and
    sizes (m) come from ``robot``; MuJoCo derives each rod's inertia from its geoms."""
    half = robot.rod.length_m / 2
    bodies = []
    for i, (a, b) in enumerate(robot.topology.rods):
        colour = _fmt(ROD_COLOURS[i])
        sites = []
        for cable in cables:
            for end_name, end in (("a", cable.a), ("b", cable.b)):
                if end.rod == i:
                    sites.append(f'<site name="cable{cable.index}_{end_name}" pos="{_fmt(end.local_m)}" size="0.002"/>')
        quat = rotation_to_quat(rotations[i])
        bodies.append(
            f"""
    <body name="rod{i}" pos="{_fmt(centres[i])}" quat="{_fmt(quat)}">
      <freejoint name="rod{i}"/>
      <geom name="rod{i}_bar" type="capsule" fromto="0 0 {-half:.9g} 0 0 {half:.9g}"
            size="{robot.rod.radius_m:.9g}" mass="{robot.rod.mass_kg:.9g}" rgba="0.15 0.15 0.15 1"/>
      <geom name="cap{a}" type="sphere" pos="0 0 {-half:.9g}" size="{robot.end_cap.radius_m:.9g}"
            mass="{robot.end_cap.mass_kg:.9g}" rgba="{colour}"/>
      <geom name="cap{b}" type="sphere" pos="0 0 {half:.9g}" size="{robot.end_cap.radius_m:.9g}"
            mass="{robot.end_cap.mass_kg:.9g}" rgba="{colour}"/>
      <geom name="rod{i}_motor0" type="cylinder" pos="0 0 {-robot.motor.offset_m:.9g}"
            size="{robot.motor.radius_m:.9g} {robot.motor.length_m / 2:.9g}" mass="{robot.motor.mass_kg:.9g}"
            rgba="0.05 0.05 0.05 1"/>
      <geom name="rod{i}_motor1" type="cylinder" pos="0 0 {robot.motor.offset_m:.9g}"
            size="{robot.motor.radius_m:.9g} {robot.motor.length_m / 2:.9g}" mass="{robot.motor.mass_kg:.9g}"
            rgba="0.05 0.05 0.05 1"/>
      {"".join(sites)}
    </body>"""
        )
    return "".join(bodies)


def build_twin_xml(robot: RobotConfig, twin: TwinConfig) -> TwinModelSpec:
    """MJCF of the robot resting on face (0, 2, 5) of its reference prism."""
    caps = resting_on_face(robot, reference_prism(robot))
    caps[:, 2] += 0.002
    centres, rotations = rod_frames(robot, caps)
    cables = build_cables(robot, twin.attachment_phase_rad)
    g = twin.ground
    cam = twin.camera
    right, up, _ = camera_axes(cam)

    bodies = rod_bodies_xml(robot, cables, centres, rotations)
    tendons = "\n".join(
        f'    <spatial name="cable{c.index}" width="0.0015" rgba="0.9 0.9 0.9 1">'
        f'<site site="cable{c.index}_a"/><site site="cable{c.index}_b"/></spatial>'
        for c in cables
    )
    actuators = "\n".join(
        f'    <general name="cable{c.index}" tendon="cable{c.index}" gainprm="1" ctrllimited="false"/>' for c in cables
    )
    xml = f"""<mujoco model="{robot.name}_twin">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{twin.physics.timestep_s:.9g}" gravity="0 0 {-twin.physics.gravity_m_s2:.9g}"
          integrator="implicitfast" cone="elliptic"/>
  <visual>
    <global offwidth="{max(cam.width_px, 640)}" offheight="{max(cam.height_px, 480)}"/>
    <quality shadowsize="0"/>
    <map znear="0.01" zfar="50"/>
  </visual>
  <default>
    <geom condim="6" friction="{g.friction_sliding:.9g} {g.friction_torsional:.9g} {g.friction_rolling:.9g}"
          solref="{g.contact_time_constant_s:.9g} {g.contact_damping_ratio:.9g}"/>
  </default>
{FLOOR_ASSET}  <worldbody>
    <light name="sun" directional="true" pos="0 0 4" dir="0.2 0.3 -1" diffuse="0.8 0.8 0.8" castshadow="false"/>
    <light name="fill" directional="true" pos="0 0 4" dir="-0.3 -0.2 -1" diffuse="0.3 0.3 0.3" castshadow="false"/>
    <geom name="ground" type="plane" size="0 0 1" material="floor"/>
    <camera name="rgbd" mode="fixed" pos="{_fmt(cam.position_m)}" xyaxes="{_fmt(right)} {_fmt(up)}"
            fovy="{cam.fovy_deg:.9g}"/>
{bodies}
  </worldbody>
  <tendon>
{tendons}
  </tendon>
  <actuator>
{actuators}
  </actuator>
</mujoco>
"""
    quats = np.array([rotation_to_quat(r) for r in rotations])
    return TwinModelSpec(xml=xml, cables=cables, initial_rod_pos_m=centres, initial_rod_quat=quats)
