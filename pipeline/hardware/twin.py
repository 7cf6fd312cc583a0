"""The MuJoCo twin: the default hardware backend (docs/design.md, *Hardware*).

It runs the robot of :mod:`pipeline.hardware.twin_model` with the hidden parameters
of a :class:`~pipeline.config.TwinConfig`: per-motor speeds, cable stiffness and
damping, a cubic passive-tendon stiffness, ground friction, control latency,
sensor noise and bias, and a calibrated RGB-D camera. The same PID as the robot
firmware closes the loop on the *sensed* cable lengths at the control rate.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco

from pipeline.config import RobotConfig, TwinConfig
from pipeline.control import PID, REST_LENGTH_LIMITS_M, motor_speed_rad_s, rest_length_change_m
from pipeline.errors import HardwareError
from pipeline.hardware.base import (
    CameraInfo,
    FramePacket,
    GroundTruthPacket,
    Packet,
    ProgressCallback,
    Robot,
    SensorPacket,
    StartPose,
)
from pipeline.hardware.camera import TwinCamera
from pipeline.hardware.twin_model import build_twin_xml, camera_axes
from pipeline.policies import REST_TARGET, Policy
from pipeline.robot_model import N_ACTUATED, N_CABLES, length_to_target, target_to_length

log = logging.getLogger(__name__)

_Command = tuple[int, np.ndarray, np.ndarray]
"""One tick's (segment, normalised target (6,), motor commands (6,) in [-1, 1])."""


@dataclass(frozen=True)
class _Snapshot:
    qpos: np.ndarray
    rest_length_m: np.ndarray
    motor_rad: np.ndarray


def _quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of quaternions (w, x, y, z)."""
    out = np.empty(4)
    mujoco.mju_mulQuat(out, a, b)
    return out


class MujocoTwin(Robot):
    """A simulated Tribar robot behind the :class:`Robot` interface.

    ``fail_after_s``, when set, makes :meth:`execute` raise :class:`HardwareError`
    after that much robot time, as a real robot losing its connection would.
    """

    def __init__(self, robot: RobotConfig, twin: TwinConfig, fail_after_s: float | None = None) -> None:
        self.robot = robot
        self.twin = twin
        self.fail_after_s = fail_after_s
        spec = build_twin_xml(robot, twin)
        self.model = mujoco.MjModel.from_xml_string(spec.xml)
        self.data = mujoco.MjData(self.model)
        self.cables = spec.cables
        self._rng = np.random.default_rng(twin.seed)
        self._cap_geoms = np.array(
            [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, f"cap{c}") for c in range(6)]
        )
        self._rod_bodies = np.array(
            [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, f"rod{i}") for i in range(3)]
        )
        dt = self.model.opt.timestep
        self._steps_per_tick = max(1, round(1.0 / (robot.pid.control_rate_hz * dt)))
        self._latency_steps = round(twin.control_latency_s / dt)
        self._omega_max = twin.motor.omega_max_rad_s * np.asarray(twin.motor.speed_scale)
        tau = twin.motor.time_constant_s
        # exact discretisation of d(omega)/dt = (omega_cmd - omega) / tau over one physics step
        self._motor_lag = float(np.exp(-dt / tau)) if tau > 0 else 0.0
        c = twin.cables
        self._k = np.r_[np.full(N_ACTUATED, c.actuated_stiffness_n_per_m), np.full(3, c.passive_stiffness_n_per_m)]
        self._k3 = np.r_[np.zeros(N_ACTUATED), np.full(3, c.passive_cubic_stiffness_n_per_m3)]
        self._damping = np.r_[
            np.full(N_ACTUATED, c.actuated_damping_n_s_per_m), np.full(3, c.passive_damping_n_s_per_m)
        ]
        self._rest_length = np.r_[target_to_length(robot, REST_TARGET), np.full(3, c.passive_rest_length_m)]
        self._omega_prev = np.zeros(N_ACTUATED)
        self._motor_rad = np.zeros(N_ACTUATED)
        cam = twin.camera
        right, up, forward = camera_axes(cam)
        camera_to_world = np.eye(4)
        camera_to_world[:3, :3] = np.column_stack([right, -up, forward])
        camera_to_world[:3, 3] = cam.position_m
        self.rgbd = TwinCamera(self.model, self.data, cam, camera_to_world)
        self._stop_requested = False
        self._rest = self._settle()
        self.reset()

    # ----------------------------------------------------------------- physics
    def _apply_cable_forces(self) -> None:
        """Set actuator controls to minus the tension of each tension-only cable."""
        stretch = self.data.ten_length - self._rest_length
        tension = self._k * stretch + self._k3 * stretch**3 + self._damping * self.data.ten_velocity
        self.data.ctrl[:] = -np.where(stretch > 0, np.maximum(tension, 0.0), 0.0)

    def _physics_step(self, u: np.ndarray) -> None:
        """Advance one physics step with motor commands ``u`` (6,) applied."""
        dt = self.model.opt.timestep
        omega = motor_speed_rad_s(self.robot.motor.speed, self._omega_max, u)
        if self._motor_lag > 0.0:
            omega = omega + (self._omega_prev - omega) * self._motor_lag
        winch_radius = self.robot.motor.winch_radius_m
        rest = np.clip(
            self._rest_length[:N_ACTUATED] - rest_length_change_m(self._omega_prev, omega, winch_radius, dt),
            *REST_LENGTH_LIMITS_M,
        )
        # a winch held at a mechanical limit does not turn: the angle follows the cable actually wound
        self._motor_rad += (self._rest_length[:N_ACTUATED] - rest) / winch_radius
        self._rest_length[:N_ACTUATED] = rest
        self._omega_prev = omega
        mujoco.mj_step1(self.model, self.data)
        self._apply_cable_forces()
        mujoco.mj_step2(self.model, self.data)

    def _run_ticks(self, targets: np.ndarray, duration_s: float) -> None:
        """Hold ``targets`` under PID control without recording (used to settle)."""
        pid = PID(self.robot.pid)
        for _ in range(round(duration_s * self.robot.pid.control_rate_hz)):
            u = pid.step(length_to_target(self.robot, self._true_lengths()[:N_ACTUATED]), targets)
            for _ in range(self._steps_per_tick):
                self._physics_step(u)

    def _true_lengths(self) -> np.ndarray:
        mujoco.mj_fwdPosition(self.model, self.data)
        return self.data.ten_length.copy()

    def _settle(self) -> _Snapshot:
        """Drop the reference prism on face (0, 2, 5) and let it come to rest at targets 1."""
        mujoco.mj_resetData(self.model, self.data)
        mujoco.mj_forward(self.model, self.data)
        self._run_ticks(REST_TARGET, self.twin.settle_s)
        qvel_peak = float(np.abs(self.data.qvel).max())
        if not np.isfinite(self.data.qpos).all() or qvel_peak > 3e-2:
            raise HardwareError(
                f"twin did not settle to rest within settle_s = {self.twin.settle_s} s (max |qvel| = {qvel_peak:.3g})"
            )
        return _Snapshot(self.data.qpos.copy(), self._rest_length.copy(), np.zeros(N_ACTUATED))

    # ----------------------------------------------------------------- sensors
    def _sense_cables(self) -> np.ndarray:
        true = self._true_lengths()
        noise = self._rng.normal(0.0, self.twin.sensors.cable_noise_std_m, N_CABLES)
        return true + np.asarray(self.twin.sensors.cable_bias_m) + noise

    def _imu(self) -> dict[int, np.ndarray]:
        out = {}
        for rod in self.robot.sensors.imu_rods:
            q = self.data.xquat[self._rod_bodies[rod]].copy()
            noise = np.zeros(4)
            rotvec = self._rng.normal(0.0, self.twin.sensors.imu_noise_std_rad, 3)
            mujoco.mju_axisAngle2Quat(noise, rotvec / max(np.linalg.norm(rotvec), 1e-12), np.linalg.norm(rotvec))
            measured = np.zeros(4)
            mujoco.mju_mulQuat(measured, noise, q)
            out[rod] = measured if measured[0] >= 0 else -measured
        return out

    def ground_truth(self, t_s: float, segment: int) -> GroundTruthPacket:
        """Current end-cap centres and rod poses in the world frame."""
        return GroundTruthPacket(
            t_s=t_s,
            segment=segment,
            caps_m=self.data.geom_xpos[self._cap_geoms].copy(),
            rod_pos_m=self.data.xpos[self._rod_bodies].copy(),
            rod_quat=self.data.xquat[self._rod_bodies].copy(),
        )

    def attachment_sites(self) -> list[tuple[int, np.ndarray]]:
        """Every cable end now: (end cap, world position (3,) m), two per cable (ground truth)."""
        mujoco.mj_fwdPosition(self.model, self.data)
        sites = []
        for cable in self.cables:
            for side, end in (("a", cable.a), ("b", cable.b)):
                site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, f"cable{cable.index}_{side}")
                sites.append((end.cap, self.data.site_xpos[site].copy()))
        return sites

    @property
    def camera(self) -> CameraInfo:
        return self.rgbd.info

    def render(self, t_s: float) -> FramePacket:
        """Render the calibrated camera now, stamped ``t_s`` (:meth:`TwinCamera.capture`)."""
        frame = self.rgbd.capture(t_s, self._rng)
        self.rgbd.frames()  # the twin hands its frames on itself, in its packet stream
        return frame

    # ----------------------------------------------------------------- Robot API
    def reset(self, start: StartPose | None = None, seed: int | None = None) -> None:
        """Back to the settled rest state, placed at ``start``; ``seed`` (optional) restarts the
        noise generator."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[:] = self._rest.qpos if start is None else self._placed(start)
        self._rest_length = self._rest.rest_length_m.copy()
        self._motor_rad = self._rest.motor_rad.copy()
        self._omega_prev = np.zeros(N_ACTUATED)
        self._stop_requested = False
        mujoco.mj_forward(self.model, self.data)

    def stop(self) -> None:
        self._stop_requested = True

    def _placed(self, start: StartPose) -> np.ndarray:
        """The settled rest ``qpos`` (three free joints: position, then quaternion w, x, y, z)
        turned about the vertical through the rods' centroid and moved on the ground."""
        qpos = self._rest.qpos.copy().reshape(3, 7)
        centre = qpos[:, :2].mean(axis=0)
        c, s = np.cos(start.yaw_rad), np.sin(start.yaw_rad)
        turn = np.array([[c, -s], [s, c]])
        qpos[:, :2] = (qpos[:, :2] - centre) @ turn.T + centre + np.array([start.x_m, start.y_m])
        half = 0.5 * start.yaw_rad
        qz = np.array([np.cos(half), 0.0, 0.0, np.sin(half)])
        for rod in qpos:
            rod[3:] = _quat_multiply(qz, rod[3:])
        return qpos.reshape(-1)

    def execute(
        self,
        policy: Policy,
        segment_timeout_s: float,
        record_frames: bool = True,
        progress: ProgressCallback | None = None,
        final_hold_s: float = 1.0,
    ) -> Iterator[Packet]:
        """Run ``policy``; see :meth:`Robot.execute`.

        After the last target is reached the robot is recorded for ``final_hold_s``
        more seconds so the trajectory ends at rest.
        """
        pid = PID(self.robot.pid)
        segment = 0
        segment_start = 0.0
        hold_until: float | None = None

        def control(t: float, position: np.ndarray) -> _Command | None:
            nonlocal segment, segment_start, hold_until
            target = policy.targets[segment]
            if hold_until is None:
                reached = pid.within_tolerance(position, target).all()
                timed_out = t - segment_start >= segment_timeout_s
                if timed_out and not reached:
                    log.warning("segment %d of '%s' timed out after %.1f s", segment, policy.name, segment_timeout_s)
                if reached or timed_out:
                    if segment + 1 < len(policy):
                        segment += 1
                        segment_start = t
                        target = policy.targets[segment]
                        pid.reset()
                    else:
                        hold_until = t + final_hold_s
            elif t >= hold_until:
                return None
            return segment, target.copy(), pid.step(position, target)

        yield from self._run(control, record_frames, progress)

    def execute_controls(
        self, controls: np.ndarray, duration_s: float, record_frames: bool = False
    ) -> Iterator[Packet]:
        """Hold raw motor commands ``controls`` (6,) in [-1, 1] for ``duration_s`` (s), no PID; each
        sample's target is the sensed position (normalised), segment 0."""
        u = np.clip(np.asarray(controls, float), -1.0, 1.0)
        ticks = round(duration_s * self.robot.pid.control_rate_hz)
        tick_s = 1.0 / self.robot.pid.control_rate_hz

        def control(t: float, position: np.ndarray) -> _Command | None:
            return None if t >= ticks * tick_s - 1e-9 else (0, position.copy(), u.copy())

        yield from self._run(control, record_frames, None)

    def _run(
        self,
        control: Callable[[float, np.ndarray], _Command | None],
        record_frames: bool,
        progress: ProgressCallback | None,
    ) -> Iterator[Packet]:
        """The control loop: every tick senses, asks ``control(t, position)`` for (segment, target,
        motor commands) or None to end, streams the tick's packets and steps the physics with the
        commands the control latency has let through."""
        self._stop_requested = False
        tick_s = 1.0 / self.robot.pid.control_rate_hz
        frame_period = 1.0 / self.twin.camera.rate_hz
        jitter = self.twin.sensors.sample_jitter_s
        pending: deque[tuple[int, np.ndarray]] = deque()
        applied = np.zeros(N_ACTUATED)
        step_index = 0
        tick = 0
        next_frame = 0.0
        while not self._stop_requested:
            t = tick * tick_s
            if self.fail_after_s is not None and t >= self.fail_after_s:
                raise HardwareError(f"twin: connection lost at t = {t:.2f} s (fault injected by fail_after_s)")
            sensed = self._sense_cables()
            command = control(t, length_to_target(self.robot, sensed[:N_ACTUATED]))
            if command is None:
                break
            segment, target, u = command
            pending.append((step_index + self._latency_steps, u))
            stamp = t + float(np.clip(self._rng.normal(0.0, jitter), -0.4 * tick_s, 0.4 * tick_s)) if t > 0 else 0.0
            yield SensorPacket(
                t_s=stamp,
                segment=segment,
                target=target,
                control=u,
                cable_m=sensed,
                imu_quat=self._imu(),
                motor_rad=self._motor_rad.copy(),
            )
            yield self.ground_truth(t, segment)
            if record_frames and t >= next_frame - 1e-9:
                yield self.render(t)
                next_frame += frame_period
            for _ in range(self._steps_per_tick):
                while pending and pending[0][0] <= step_index:
                    applied = pending.popleft()[1]
                self._physics_step(applied)
                step_index += 1
            if not np.isfinite(self.data.qpos).all():
                raise HardwareError(f"twin: simulation diverged at t = {t:.2f} s")
            tick += 1
            if progress is not None:
                progress(t + tick_s)

    def close(self) -> None:
        """Release the renderer's GL context."""
        self.rgbd.close()
