"""Replay of an engine on held-out gaits, scored part by part (sim-to-real notes: inspect every part).

Two replays of the same held-out gaits of a recording:

* key frames: the gaits run as in the Key Frame Loss (chunks from observations, the
  lead-in chunks' starts fitted with the replayed parameters and carried through the
  lead-ins, own timing, no mask filter); the end-cap displacement error at every key
  frame;
* open loop: all held-out gaits in one rollout from the first chunk's start, as a policy
  would be executed; at the end (each execution at the end of its own last gait) the
  centre-of-mass error (m and % of rod length), the heading error (deg) and each rod's
  centre error.

Held-out gaits are a recording's last ones, so the robot is moving where they start. Unless
they start the recording, the gait before them (fitted, not held out) is run first as the
first chunk's lead-in: its start is fitted to its data, and the held-out gaits start where it
ends, moving as the data did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config import RobotConfig, SysidConfig
from pipeline.physics.engine import Engine
from pipeline.physics.params import Params
from pipeline.robot_model import heading_rad
from pipeline.sysid.data import Gait, Recording, split_gaits
from pipeline.sysid.losses import KeyFrameLoss
from pipeline.sysid.windows import WindowStarts, run_windows


@dataclass(frozen=True)
class Replay:
    """Scores of one engine on one recording's held-out gaits (lengths in m, angles in deg).

    ``key_frame_error_m`` mean end-cap error at the key frames; ``key_frame_error_median_m`` the
    median over the key frames of each one's mean end-cap error (the typical gait: the mean is
    carried by the few where one execution tipped over an edge and the other did not);
    ``key_frame_error_per_rod_m`` (3,); ``final_com_error_m`` and ``final_com_error_pct`` (of the rod length);
    ``final_heading_error_deg``; ``final_rod_error_m`` (3,) rod-centre errors; ``engine_caps_m``
    (T, 6, 3) and ``data_caps_m`` (K, 6, 3) the two open-loop paths for plots.
    """

    recording: str
    gaits: int
    key_frame_error_m: float
    key_frame_error_median_m: float
    key_frame_error_per_rod_m: np.ndarray
    final_com_error_m: float
    final_com_error_pct: float
    final_heading_error_deg: float
    final_rod_error_m: np.ndarray
    engine_caps_m: np.ndarray
    data_caps_m: np.ndarray

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat figures for logging, every key starting with ``prefix``."""
        out = {
            f"{prefix}key_frame_error_mm": 1000 * self.key_frame_error_m,
            f"{prefix}key_frame_error_median_mm": 1000 * self.key_frame_error_median_m,
            f"{prefix}final_com_error_mm": 1000 * self.final_com_error_m,
            f"{prefix}final_com_error_pct": self.final_com_error_pct,
            f"{prefix}final_heading_error_deg": self.final_heading_error_deg,
        }
        for rod in range(3):
            out[f"{prefix}key_frame_error_rod{rod}_mm"] = 1000 * float(self.key_frame_error_per_rod_m[rod])
            out[f"{prefix}final_rod{rod}_error_mm"] = 1000 * float(self.final_rod_error_m[rod])
        return out


def replay(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    recording: Recording,
    gaits: list[Gait],
    config: SysidConfig,
    segment_timeout_s: float,
) -> Replay:
    """Score ``params`` (one environment) on ``gaits`` (consecutive, of ``recording``; recorded
    with segment timeout ``segment_timeout_s``)."""
    return replay_recordings(engine, params, robot, {recording.name: (recording, gaits, segment_timeout_s)}, config)[
        recording.name
    ]


def replay_recordings(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    held: dict[str, tuple[Recording, list[Gait], float]],
    config: SysidConfig,
    estimator: Engine | None = None,
) -> dict[str, Replay]:
    """:func:`replay` of each recording's gaits: ``held`` maps a name to a recording (of that name),
    its gaits (consecutive) and its segment timeout (s); the replays are keyed the same way. The
    key frames of every recording run as one engine batch (their lead-ins' start fits too: one
    batch of every lead-in and coordinate per Levenberg-Marquardt step, each row's fit its own),
    the open-loop rollouts one recording at a time."""
    for name, (_, gaits, _) in held.items():
        if not gaits:
            raise ValueError(f"recording '{name}': no held-out gaits to replay")
    recordings = {recording.name: recording for recording, _, _ in held.values()}
    leads = [_lead_in(recording, robot, gaits, timeout) for recording, gaits, timeout in held.values()]
    keyframes = KeyFrameLoss(
        engine,
        robot,
        recordings,
        [g for _, gaits, _ in held.values() for g in gaits],
        params,
        config.updated({"loss.mask_filter": False}),
        leads=[lead for lead in leads if lead is not None],
    ).with_fitted_starts(params, estimator)
    with torch.no_grad():
        scored = keyframes(params)
    of_gait = np.array([g.recording for g in keyframes.gaits])
    first_chunk = {}
    for k, chunk in enumerate(keyframes.chunks):
        first_chunk.setdefault(chunk[0].recording, k)
    return {
        name: _replay_one(
            engine,
            params,
            robot,
            recording,
            gaits,
            timeout,
            scored.cap_errors_m[keyframes.scored & (of_gait == recording.name)],
            keyframes.starts,
            first_chunk[recording.name],
        )
        for name, (recording, gaits, timeout) in held.items()
    }


def _replay_one(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    recording: Recording,
    gaits: list[Gait],
    segment_timeout_s: float,
    cap_errors: np.ndarray,
    chunk_starts: WindowStarts,
    first: int,
) -> Replay:
    """One recording's :class:`Replay` from its key frames' end-cap errors ``cap_errors`` (K, 6)
    and the open-loop rollout of ``gaits`` from chunk ``first`` of ``chunk_starts``."""
    rods = np.array(robot.topology.rods)
    per_rod = np.array([cap_errors[:, list(pair)].mean() for pair in rods])
    one = slice(first, first + 1)
    starts = WindowStarts(
        chunk_starts.state.index(one), chunk_starts.caps_m[one], chunk_starts.data_caps_m[one], chunk_starts.t_s[one]
    )
    targets = torch.tensor(np.stack([g.target for g in gaits]))[None]
    with torch.no_grad():
        trace, finished_s = run_windows(
            engine, params, starts, targets, robot.pid, np.array([segment_timeout_s]), robot.pid.latency_s
        )
    engine_caps = (trace.caps_m[0] - starts.caps_m[0]).numpy() + starts.data_caps_m[0]
    engine_end = engine_caps[round(finished_s[0] * robot.pid.control_rate_hz)]
    inside = (recording.caps_t_s >= gaits[0].start_s) & (recording.caps_t_s <= gaits[-1].end_s)
    data_end = recording.caps_at(np.array([gaits[-1].end_s]))[0]
    com_error = float(np.linalg.norm(engine_end.mean(0) - data_end.mean(0)))
    heading = np.degrees(heading_rad(engine_end) - heading_rad(data_end))
    rod_error = np.array([np.linalg.norm(engine_end[list(p)].mean(0) - data_end[list(p)].mean(0)) for p in rods])
    return Replay(
        recording=recording.name,
        gaits=len(gaits),
        key_frame_error_m=float(cap_errors.mean()),
        key_frame_error_median_m=float(np.median(cap_errors.mean(1))),
        key_frame_error_per_rod_m=per_rod,
        final_com_error_m=com_error,
        final_com_error_pct=100 * com_error / robot.rod.length_m,
        final_heading_error_deg=float(abs((heading + 180.0) % 360.0 - 180.0)),
        final_rod_error_m=rod_error,
        engine_caps_m=engine_caps,
        data_caps_m=recording.caps_m[inside],
    )


def _lead_in(recording: Recording, robot: RobotConfig, gaits: list[Gait], segment_timeout_s: float) -> Gait | None:
    """The recording's gait before the first of ``gaits`` (their lead-in), None where they start
    the recording."""
    if gaits[0].start_s <= recording.t_s[0]:
        return None
    return [g for g in split_gaits(recording, robot, segment_timeout_s) if g.index < gaits[0].index][-1]


def split_holdout(gaits: list[Gait], fraction: float) -> tuple[list[Gait], list[Gait]]:
    """(fit, held out): the last ``fraction`` of each recording's gaits (at least one) are held out
    when ``fraction`` > 0; each part keeps at least one gait."""
    fit, held = [], []
    for name in dict.fromkeys(g.recording for g in gaits):
        own = [g for g in gaits if g.recording == name]
        n_held = 0 if fraction <= 0 else min(len(own) - 1, max(1, round(fraction * len(own))))
        fit += own[: len(own) - n_held]
        held += own[len(own) - n_held :]
    return fit, held
