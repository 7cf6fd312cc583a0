"""What identification fits and what it is judged on: the recordings split into gaits, the
last of each recording held out, and the engine replayed on the held-out gaits.

:func:`split_recordings` makes the split (:class:`SysidData`); :func:`replay_held_out` replays
one parameter set on every recording's held-out gaits (:mod:`pipeline.sysid.validate`), and
:func:`mean_replay_metrics` averages its figures over the recordings.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.config import LoadedConfigs, RobotConfig
from pipeline.errors import DataError
from pipeline.physics import Engine, Params, RobotModel
from pipeline.sysid.data import Gait, Recording, split_gaits
from pipeline.sysid.validate import Replay, replay_recordings, split_holdout


@dataclasses.dataclass(frozen=True)
class SysidData:
    """What the sysid stage identifies from: the robot config with the attachment overlay, the
    recordings by name, and their gaits split into fitted and held out."""

    robot: RobotConfig
    recordings: dict[str, Recording]
    gaits: list[Gait]
    fit: list[Gait]
    held: list[Gait]

    def held_out(self) -> dict[str, list[Gait]]:
        """The held-out gaits by recording name, in recording order."""
        return {
            name: [g for g in self.held if g.recording == name]
            for name in dict.fromkeys(g.recording for g in self.held)
        }


def split_recordings(
    configs: LoadedConfigs, robot: RobotConfig, recordings: dict[str, Recording], source: str
) -> SysidData:
    """``recordings`` split into gaits (only the monotonic ones with ``sysid.data.monotonic_only``),
    the last ``sysid.data.holdout_fraction`` of each held out; ``source`` names the data in the error
    raised when no gait is left to identify from."""
    config = configs.pipeline.sysid
    timeout_s = configs.pipeline.collect.segment_timeout_s
    gaits = [g for r in recordings.values() for g in split_gaits(r, robot, timeout_s)]
    if config.data.monotonic_only:
        gaits = [g for g in gaits if g.monotonic]
    fit, held = split_holdout(gaits, config.data.holdout_fraction)
    if not fit:
        raise DataError(f"{source}: no gait to identify from")
    return SysidData(robot, recordings, gaits, fit, held)


def replay_held_out(
    configs: LoadedConfigs, data: SysidData, robot: RobotConfig, params: Params, engine: Engine | None = None
) -> dict[str, Replay]:
    """Replay ``params`` (one environment) on each recording's held-out gaits in ``engine`` (by
    default the analytic engine of ``robot`` at ``sysid.dt_s``). The lead-ins' start states are
    fitted in that analytic engine whatever ``engine`` is: it is the state estimator, and the
    compiled kernel fits them in a fraction of the time of a learned engine's eager rollouts."""
    config = configs.pipeline.sysid
    analytic = Engine(RobotModel.from_robot(robot), dt=config.dt_s, compiled=configs.pipeline.engine.compiled)
    timeout_s = configs.pipeline.collect.segment_timeout_s
    held = {
        name: (data.recordings[name], own, data.recordings[name].timeout_or(timeout_s))
        for name, own in data.held_out().items()
    }
    if not held:
        return {}
    return replay_recordings(engine or analytic, params, robot, held, config, analytic)


def mean_replay_metrics(replays: dict[str, Replay], prefix: str) -> dict[str, float]:
    """Each figure of :meth:`Replay.metrics` averaged over the recordings, keys starting with ``prefix``."""
    figures = [r.metrics(prefix) for r in replays.values()]
    return {key: float(np.mean([f[key] for f in figures])) for key in (figures[0] if figures else [])}


def reduction_pct(before: float, after: float) -> float:
    """How much lower ``after`` is than ``before``, in % of ``before`` (0 when ``before`` is 0)."""
    return 100.0 * (1.0 - after / before) if before > 0 else 0.0


NUDGED = ("motor_speed", "friction")
"""The parameters that :func:`smoothed_held_out_error` nudges."""


def smoothed_held_out_error(
    configs: LoadedConfigs, data: SysidData, robot: RobotConfig, params: Params, rel: float
) -> tuple[float, list[float]]:
    """The mean held-out key-frame error (mm) of ``params`` (one environment) in the engine of
    ``robot``, averaged with the four means of :data:`NUDGED` in turn times ``1 - rel`` and
    ``1 + rel``; and those four means. The mean over a dozen held-out key frames is carried by
    the few where one execution tips a rod over an edge and the other does not, which a change
    far below what identification can resolve decides; the average is the figure that such
    changes do not decide."""

    def mean_mm(values: Params) -> float:
        return mean_replay_metrics(replay_held_out(configs, data, robot, values), "")["key_frame_error_mm"]

    nudged = [
        mean_mm(params.replace(**{name: getattr(params, name) * factor}))
        for name in NUDGED
        for factor in (1 - rel, 1 + rel)
    ]
    return float(np.mean([mean_mm(params), *nudged])), nudged
