"""Engine-generated recordings: data with known parameters, for tests and benchmarks of sysid.

:func:`engine_recording` executes a policy in the engine (the PID inside, as on
the robot) and returns it as a :class:`~pipeline.sysid.data.Recording`: sensor
stream at the control rate, end caps subsampled to a camera rate with Gaussian
tracking noise, cable readings with sensor noise.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.config import RobotConfig
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rollout import run_policy, settle, state_from_caps
from pipeline.robot_model import reference_prism, resting_on_face
from pipeline.sysid.data import Recording


def engine_recording(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    targets: np.ndarray,
    name: str = "engine",
    segment_timeout_s: float = 8.0,
    caps_rate_hz: float = 10.0,
    caps_noise_m: float = 0.0,
    cable_noise_m: float = 0.0,
    seed: int = 0,
    start_caps_m: np.ndarray | None = None,
) -> Recording:
    """Run ``targets`` (S, 6) with ``params`` (one environment) from rest on face (0, 2, 5) of the
    reference prism (or ``start_caps_m`` (6, 3)) and record it."""
    rng = np.random.default_rng(seed)
    state = recording_start(engine, params, robot, start_caps_m)
    with torch.no_grad():
        _, trace = run_policy(
            engine,
            params,
            state,
            torch.as_tensor(np.asarray(targets, float), dtype=engine.model.dtype),
            robot.pid,
            segment_timeout_s,
            final_hold_s=0.5,
            latency_s=robot.pid.latency_s,
        )
    t = trace.t_s.numpy()
    segment = trace.segment[0].numpy()
    every = max(1, round(robot.pid.control_rate_hz / caps_rate_hz))
    caps = trace.caps_m[0].numpy()[::every]
    return Recording(
        name=name,
        t_s=t,
        segment=segment,
        targets=np.asarray(targets, float)[segment],
        control=trace.control[0].numpy(),
        cables_m=trace.cables_m[0].numpy() + rng.normal(0.0, cable_noise_m, trace.cables_m[0].shape),
        caps_t_s=t[::every],
        caps_m=caps + rng.normal(0.0, caps_noise_m, caps.shape),
    )


def recording_start(
    engine: Engine, params: Params, robot: RobotConfig, start_caps_m: np.ndarray | None = None
) -> State:
    """The state :func:`engine_recording` starts from: at rest on face (0, 2, 5) of the reference
    prism (or on ``start_caps_m`` (6, 3)), settled for 1 s with every cable held fully out."""
    caps0 = resting_on_face(robot, reference_prism(robot)) if start_caps_m is None else start_caps_m
    ones = torch.ones(6, dtype=engine.model.dtype)
    return settle(engine, params, state_from_caps(engine, params, caps0), robot.pid, ones, duration_s=1.0)


def exact_states(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    targets: np.ndarray,
    segments: list[int],
    segment_timeout_s: float = 8.0,
) -> State:
    """The engine's own states (one environment per entry of ``segments``) at the instants
    :func:`engine_recording` with ``params`` and ``targets`` (S, 6) started those segments:
    what a perfect state estimator would give at those instants (the PID's integral and the
    commands still in flight under latency excepted: a window restarts them)."""
    start = recording_start(engine, params, robot)
    states = []
    with torch.no_grad():
        for segment in segments:
            if segment == 0:
                states.append(start)
                continue
            before = torch.as_tensor(np.asarray(targets, float)[:segment], dtype=engine.model.dtype)
            latency_s = robot.pid.latency_s
            state, _ = run_policy(
                engine, params, start, before, robot.pid, segment_timeout_s, final_hold_s=0.0, latency_s=latency_s
            )
            states.append(state)
    return State.concat(states)
