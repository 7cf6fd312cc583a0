"""Trajectory losses for identification: the Key Frame Loss and the R2S2R paper's three alternatives.

Every loss compares end-cap *displacements* from a window's start (engine from
its settled start state, data from the tracked caps at the same instant), so an
offset left by settling the observed start is not counted. Defects are weighted
by the tracking noise: a loss of 1 means a typical end-cap defect of one
``position_sigma_m``.

* :class:`KeyFrameLoss` (ours, R2S2R paper Sec. IV-G): one window per gait, started
  from the observation at the gait's start (so nothing flows between windows),
  matched to the data gait by index; the defect at the key frame
  (:func:`~pipeline.sysid.keyframes.key_frame_offsets`), then the mask filter.
* :class:`SequenceLoss` ``last_step``: the whole policy from the first frame with
  gradients through every gait; the defects at the data's gait ends.
* :class:`SequenceLoss` ``all_step``: the same rollout, defects at every tracked frame.
* :class:`MultipleShootingLoss`: ``n`` equal windows from the observations at
  their starts, defects at the window ends.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch

from pipeline.config import RobotConfig, SysidConfig
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rollout import Trace, run_policy
from pipeline.sysid.data import Gait, Recording
from pipeline.sysid.keyframes import key_frame_offsets, mask_filter
from pipeline.sysid.start_fit import LeadIn, fit_start_states
from pipeline.sysid.windows import WindowStarts, run_windows, window_starts


@dataclass(frozen=True)
class LossValue:
    """A loss and what it saw: ``loss`` (scalar tensor), per-window weighted squared defects
    ``defects`` (W,), end-cap errors ``cap_errors_m`` (W, 6) in m, which windows are scored at
    all ``scored`` (W,) and which of those counted in ``loss`` after any filter ``kept`` (W,),
    and the engine's and data's window durations (s) where the loss has them."""

    loss: torch.Tensor
    defects: np.ndarray
    cap_errors_m: np.ndarray
    scored: np.ndarray
    kept: np.ndarray
    engine_durations_s: np.ndarray | None = None
    data_durations_s: np.ndarray | None = None

    @property
    def unfiltered(self) -> float:
        """Mean weighted defect over every scored window (no filter): comparable across parameters."""
        return float(self.defects[self.scored].mean())


@dataclass(frozen=True)
class Population:
    """What a loss says of candidates run together: each one's weighted squared ``defects``
    (P, units), a ``penalty`` (P,) that the search adds to its score as it is, and ``timing``
    (P,): the mean over the timed gaits of each one's squared duration difference, in units of
    its scale (both zero for a loss that has no durations)."""

    defects: np.ndarray
    penalty: np.ndarray
    timing: np.ndarray


class TrajectoryLoss(Protocol):
    """A loss over recorded trajectories. It is called with parameters of ``units`` environments
    ((units,) tensors, usually all equal): one per key frame (KFL) or window, so that each unit's
    gradient can be read and weighed on its own. ``scored`` (units,): which units count at all.
    ``population`` runs several parameter sets (one environment each) without gradients and
    returns each one's weighted squared defects (P, units) and search penalty (P,)."""

    name: str
    units: int
    scored: np.ndarray

    def __call__(self, params: Params) -> LossValue: ...

    def population(self, candidates: Params) -> Population: ...


def _weighted_defects(
    engine_disp: torch.Tensor, data_disp: np.ndarray, sigma_m: float
) -> tuple[torch.Tensor, np.ndarray]:
    """Mean squared end-cap defect per window (W,) in units of sigma^2, and the end-cap errors
    (W, 6) in m (mean over any middle axis); inputs (W, ..., 6, 3)."""
    data = torch.as_tensor(data_disp, dtype=engine_disp.dtype)
    squared = ((engine_disp - data) ** 2).sum(-1)
    errors = squared.detach().sqrt().reshape(squared.shape[0], -1, 6).mean(1).numpy()
    return (squared / sigma_m**2).reshape(squared.shape[0], -1).mean(-1), errors


def _tick_index(offsets_s: np.ndarray, tick_s: float, n_ticks: int) -> np.ndarray:
    return np.clip(np.round(np.asarray(offsets_s) / tick_s).astype(int), 0, n_ticks - 1)


class KeyFrameLoss:
    """KFL over ``gaits`` of ``recordings`` (by name).

    The gaits are run in chunks of consecutive gaits (about ``config.loss.chunk_s`` of data each,
    cut where the data is slowest), every chunk one environment of a batch, started from the
    observation (settled once with ``params0``). Inside a chunk the engine carries its own state
    from gait to gait, as the robot does, but the gradient is detached at every gait change: each
    key frame's gradient comes from its own gait only. A settled start has no velocity, which the
    robot mid-way through a trajectory has; so the first gait of a chunk that does not start at the
    recording's first sample (where the robot is at rest) is a lead-in: run, but not scored. That
    holds for the first of the given gaits too, when earlier ones are not given (held-out gaits);
    each of ``leads``, the gait before a recording's given ones, is then run first in that
    recording's first chunk as its lead-in, so that the first of them is scored as well.
    :meth:`with_fitted_starts` fits the lead-in chunks' starts, velocity included, to the data of
    their lead-ins and starts the chunks where the lead-ins end.
    """

    name = "kfl"

    def __init__(
        self,
        engine: Engine,
        robot: RobotConfig,
        recordings: dict[str, Recording],
        gaits: list[Gait],
        params0: Params,
        config: SysidConfig,
        leads: Sequence[Gait] = (),
    ) -> None:
        if not gaits:
            raise ValueError("the Key Frame Loss needs at least one gait")
        self.engine, self.robot, self.config, self.recordings = engine, robot, config, recordings
        self.tick_s = 1.0 / robot.pid.control_rate_hz
        chunks = plan_chunks(recordings, gaits, config.loss.chunk_s)
        for lead in leads:
            k = next(i for i, chunk in enumerate(chunks) if chunk[0].recording == lead.recording)
            chunks[k] = [lead, *chunks[k]]
        self._use_chunks(
            chunks, np.array([chunk[0].start_s > recordings[chunk[0].recording].t_s[0] for chunk in chunks])
        )
        starts = [(recordings[chunk[0].recording], chunk[0].start_s) for chunk in chunks]
        self.starts = window_starts(engine, params0, robot, starts, config.loss.settle_s)
        self.observed = self

    @property
    def settled(self) -> WindowStarts:
        """The settled observed starts of the chunks as planned (lead-ins included)."""
        return self.observed.starts

    def engine_limit_s(self, gait: Gait) -> float:
        """How long (s) the engine may run ``gait``: ``config.loss.duration_cap`` times the data's
        duration, or, where the data timed out (target not reached), just as long: the firmware
        gave up there, and so does the engine."""
        cap = self.config.loss.duration_cap if gait.reached else 1.0
        return cap * gait.duration_s + self.tick_s

    def _use_chunks(self, chunks: list[list[Gait]], lead_in: np.ndarray) -> None:
        """Run ``chunks`` (each a list of consecutive gaits); ``lead_in`` (C,): which chunks' first
        gait is run but not scored."""
        self.chunks, self.lead_in = chunks, lead_in
        self.gaits = [g for chunk in chunks for g in chunk]
        n = max(len(c) for c in chunks)
        self.targets = torch.tensor(np.stack([_padded([g.target for g in c], n) for c in chunks]))
        caps = [[self.engine_limit_s(g) for g in c] for c in chunks]
        self.timeout = np.stack([np.r_[c, np.full(n - len(c), self.tick_s)] for c in caps])
        self.data_durations = np.array([g.duration_s for g in self.gaits])
        self.reached = np.array([g.reached for g in self.gaits])
        self.scored = np.array(
            [j > 0 or not lead for chunk, lead in zip(chunks, lead_in, strict=True) for j in range(len(chunk))]
        )
        names = sorted(self.recordings)
        self.group = np.array([names.index(g.recording) for g in self.gaits])
        self.units = len(self.gaits)
        first = np.cumsum([0] + [len(c) for c in chunks])[:-1]
        self.unit_index = torch.tensor(
            [[first[c] + min(j, len(chunk) - 1) for j in range(n)] for c, chunk in enumerate(chunks)]
        )

    def __call__(self, params: Params) -> LossValue:
        """``params``: one environment per gait (``units``), in chunk order."""
        defects, errors, engine_durations = self._key_frames(params, copies=1)
        kept = self.scored.copy()
        if self.config.loss.mask_filter:
            for group in np.unique(self.group):
                own = (self.group == group) & self.scored
                kept[own] = mask_filter(engine_durations[0][own], self.data_durations[own], self.tick_s)
        loss = defects[0][torch.as_tensor(kept)].mean()
        return LossValue(
            loss, defects[0].detach().numpy(), errors[0], self.scored, kept, engine_durations[0], self.data_durations
        )

    def with_start_states(self, state: State) -> KeyFrameLoss:
        """This loss with its chunks started from ``state`` (one environment per chunk, in
        ``chunks`` order) instead of the settled observations: for start-state estimators, and to
        measure what the reconstruction costs (exact states on engine data)."""
        if state.batch_size != len(self.chunks):
            raise ValueError(f"need one start state per chunk ({len(self.chunks)}), got {state.batch_size}")
        other = copy.copy(self)
        other.starts = replace(self.starts, state=state, caps_m=self.engine.cap_positions(state).detach())
        return other

    def with_fitted_starts(self, params: Params, estimator: Engine | None = None) -> KeyFrameLoss:
        """This loss with each lead-in chunk started where its lead-in ends, and the lead-in gait no
        longer run: its settled observation is fitted with ``params`` (one environment) to the data
        of the lead-in's first ``config.start_fit.span_s``
        (:func:`~pipeline.sysid.start_fit.fit_start_states`) and run through the lead-in gait with
        ``params``. Every candidate then starts the scored gaits from that same state, moving as
        the data did, instead of running the lead-in itself from a start fitted for other
        parameters. The chunks that start a recording keep their settled starts (the robot is at
        rest there). Always fitted from the settled observations (:attr:`observed`); with
        ``config.start_fit.iterations`` 0 the lead-ins run from them as they are, which scores the
        gaits as this loss does. Commands still in flight at a lead-in's end (a control latency)
        are not carried over. ``estimator`` (by default this loss's engine) is the engine the starts
        are fitted in, the state estimator; the lead-ins run in this loss's engine."""
        source = self.observed
        rows = np.flatnonzero(source.lead_in)
        if not len(rows):
            return source
        index = torch.as_tensor(rows)
        leads = [
            LeadIn(
                self.recordings[source.chunks[k][0].recording],
                source.chunks[k][0].start_s,
                min(source.chunks[k][0].duration_s, self.config.start_fit.span_s),
            )
            for k in rows
        ]
        fitted = fit_start_states(
            estimator or self.engine,
            params,
            self.robot,
            replace(source.starts, state=source.starts.state.index(index)),
            leads,
            source.targets[index],
            source.timeout[rows],
            self.config.start_fit.iterations,
            self.config.start_fit.caps_sigma_m,
            self.config.start_fit.cable_sigma_m,
        )
        one = Params(**{n: v.detach() for n, v in params.as_dict().items()})
        with torch.no_grad():
            ends, _ = run_policy(
                self.engine,
                one.expand(len(rows)),
                fitted,
                source.targets[index, :1],
                self.robot.pid,
                torch.as_tensor(source.timeout[rows, :1]),
                final_hold_s=0.0,
                latency_s=self.robot.pid.latency_s,
            )
        states, chunks = [], []
        for k, chunk in enumerate(source.chunks):
            if not source.lead_in[k]:
                states.append(source.starts.state.index(slice(k, k + 1)))
                chunks.append(chunk)
            elif len(chunk) > 1:
                j = int(np.flatnonzero(rows == k)[0])
                states.append(ends.index(slice(j, j + 1)))
                chunks.append(chunk[1:])
        other = copy.copy(source)
        other._use_chunks(chunks, np.zeros(len(chunks), dtype=bool))
        state = State.concat(states)
        times = np.array([chunk[0].start_s for chunk in chunks])
        other.starts = WindowStarts(
            state=state,
            caps_m=self.engine.cap_positions(state).detach(),
            data_caps_m=np.stack(
                [self.recordings[c[0].recording].caps_at(t[None])[0] for c, t in zip(chunks, times, strict=True)]
            ),
            t_s=times,
        )
        return other

    def population(self, candidates: Params) -> Population:
        """Weighted squared key-frame defects (P, units) of ``candidates`` (P environments, one
        parameter set each), all run as one engine batch, without gradients; the penalty is
        ``config.search.duration_weight`` times the squared mean difference of the engine's and the data's
        scored gait durations, in ``config.search.duration_sigma_s``. Pooled over every gait, the timing
        pins the motor speed without the tick-by-tick jumps of single gaits' durations. The timing
        is the mean of the gaits' squared differences: it tells a control latency (the same delay
        in every gait) from the motor speed (a delay in proportion to the gait's travel), which the
        pooled difference cannot (:mod:`~pipeline.sysid.latency`). Gaits that timed out in the data
        (``Gait.reached`` false) do not count: their duration is the timeout, not the robot's."""
        count = candidates.batch_size
        per_unit = Params(**{n: v.repeat_interleave(self.units) for n, v in candidates.as_dict().items()})
        with torch.no_grad():
            defects, _, durations = self._key_frames(per_unit, copies=count)
        timed = self.scored & self.reached
        if not timed.any():
            return Population(defects.numpy(), np.zeros(count), np.zeros(count))
        late = (durations - self.data_durations)[:, timed] / self.config.search.duration_sigma_s
        return Population(defects.numpy(), self.config.search.duration_weight * late.mean(1) ** 2, (late**2).mean(1))

    def _key_frames(self, params: Params, copies: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """Run every chunk ``copies`` times (``params``: ``copies * units`` environments, copy-major)
        and return the weighted squared defects (copies, units), the end-cap errors
        (copies, units, 6) in m and the engine's gait durations (copies, units) in s."""
        chunks = len(self.chunks)
        index = torch.cat([self.unit_index + k * self.units for k in range(copies)])
        expanded = params.expand(copies * self.units).as_dict()
        per_segment = Params(**{n: v[index] for n, v in expanded.items()})
        rows_of_chunks = torch.arange(chunks).repeat(copies)
        starts = replace(self.starts, state=self.starts.state.index(rows_of_chunks))
        trace, _ = run_windows(
            self.engine,
            per_segment,
            starts,
            self.targets[rows_of_chunks],
            self.robot.pid,
            np.tile(self.timeout, (copies, 1)),
            self.robot.pid.latency_s,
            detach_between_segments=True,
        )
        segment = trace.segment.numpy()
        finished = trace.finished.numpy()
        rows, start_ticks, end_ticks = [], [], []
        for row in range(copies * chunks):
            for j in range(len(self.chunks[row % chunks])):
                later = np.flatnonzero((segment[row] > j) | finished[row])
                start_ticks.append(int(np.argmax(segment[row] >= j)))
                end_ticks.append(int(later[0]) if len(later) else segment.shape[1] - 1)
                rows.append(row)
        start_ticks, end_ticks = np.array(start_ticks), np.array(end_ticks)
        engine_durations = (end_ticks - start_ticks) * self.tick_s
        offsets = key_frame_offsets(engine_durations, np.tile(self.data_durations, copies))
        key_ticks = np.minimum(start_ticks + np.round(offsets / self.tick_s).astype(int), trace.caps_m.shape[1] - 1)
        rows_t = torch.as_tensor(rows)
        key_caps = trace.caps_m[rows_t, torch.as_tensor(key_ticks)]
        engine_disp = key_caps - trace.caps_m[rows_t, torch.as_tensor(start_ticks)].detach()
        data_disp = np.stack(
            [
                np.diff(self.recordings[g.recording].caps_at(np.array([g.start_s, g.start_s + o])), axis=0)[0]
                for g, o in zip(self.gaits * copies, offsets, strict=True)
            ]
        )
        defects, errors = _weighted_defects(engine_disp, data_disp, self.config.loss.position_sigma_m)
        shape = (copies, self.units)
        return defects.reshape(shape), errors.reshape(*shape, 6), engine_durations.reshape(shape)


def plan_chunks(recordings: dict[str, Recording], gaits: list[Gait], chunk_s: float) -> list[list[Gait]]:
    """Consecutive gaits of each recording grouped into chunks of about ``chunk_s`` (s) of data.

    A chunk is closed at the gait boundary, among those after 60-100 % of ``chunk_s``,
    where the tracked end caps move slowest, so the next chunk starts close to rest.
    """
    chunks: list[list[Gait]] = []
    for name in sorted({g.recording for g in gaits}):
        own = [g for g in gaits if g.recording == name]
        recording = recordings[name]
        first = 0
        while first < len(own):
            elapsed = np.cumsum([g.duration_s for g in own[first:]])
            candidates = np.flatnonzero((elapsed >= 0.6 * chunk_s) & (elapsed <= chunk_s))
            if elapsed[-1] <= chunk_s:
                cut = len(elapsed)
            elif len(candidates) == 0:
                cut = max(1, int(np.searchsorted(elapsed, chunk_s)))
            else:
                speeds = [_cap_speed(recording, own[first + k].end_s) for k in candidates]
                cut = int(candidates[int(np.argmin(speeds))]) + 1
            chunks.append(own[first : first + cut])
            first += cut
    return chunks


def _cap_speed(recording: Recording, time_s: float, half_window_s: float = 0.1) -> float:
    """Mean end-cap speed (m/s) of the tracked data around ``time_s``."""
    caps = recording.caps_at(np.array([time_s - half_window_s, time_s + half_window_s]))
    return float(np.linalg.norm(caps[1] - caps[0], axis=-1).mean() / (2 * half_window_s))


class _PolicyRollouts:
    """What the sequence and multiple-shooting losses share: each window runs its policy from an
    observed start (``starts``, ``targets``, ``segment_timeout_s``) for a fixed span."""

    engine: Engine
    robot: RobotConfig
    starts: WindowStarts
    targets: torch.Tensor
    segment_timeout_s: np.ndarray
    units: int

    @property
    def scored(self) -> np.ndarray:
        """Every window is scored."""
        return np.ones(self.units, dtype=bool)

    def population(self, candidates: Params) -> Population:
        """Weighted squared defects (P, units) of ``candidates`` (P environments), one rollout each;
        no penalty, no timing."""
        rows = []
        with torch.no_grad():
            for k in range(candidates.batch_size):
                one = Params(**{n: v[k : k + 1] for n, v in candidates.as_dict().items()})
                rows.append(self(one.expand(self.units)).defects)
        return Population(np.stack(rows), np.zeros(len(rows)), np.zeros(len(rows)))

    def _rollout(self, params: Params, span_s: float) -> Trace:
        trace, _ = run_windows(
            self.engine,
            params,
            self.starts,
            self.targets,
            self.robot.pid,
            self.segment_timeout_s,
            self.robot.pid.latency_s,
            hold_s=span_s,
            max_time_s=span_s,
        )
        return trace


def _every_window(defects: torch.Tensor, errors: np.ndarray) -> LossValue:
    """A loss value that scores and keeps every window."""
    everything = np.ones(len(defects), dtype=bool)
    return LossValue(defects.mean(), defects.detach().numpy(), errors, everything, everything)


class SequenceLoss(_PolicyRollouts):
    """``last_step`` or ``all_step``: one rollout per recording of all its gaits from the first
    gait's start, gradients through the whole rollout."""

    def __init__(
        self,
        engine: Engine,
        robot: RobotConfig,
        recordings: dict[str, Recording],
        gaits: list[Gait],
        params0: Params,
        config: SysidConfig,
        segment_timeout_s: float,
        mode: str,
    ) -> None:
        if mode not in ("last_step", "all_step"):
            raise ValueError(f"mode must be 'last_step' or 'all_step', got {mode!r}")
        self.name = mode
        self.engine, self.robot, self.config = engine, robot, config
        self.names = sorted({g.recording for g in gaits})
        by_name = {n: [g for g in gaits if g.recording == n] for n in self.names}
        firsts = [(recordings[n], by_name[n][0].start_s) for n in self.names]
        self.starts: WindowStarts = window_starts(engine, params0, robot, firsts, config.loss.settle_s)
        n_targets = max(len(v) for v in by_name.values())
        self.targets = torch.tensor(np.stack([_padded([g.target for g in by_name[n]], n_targets) for n in self.names]))
        self.segment_timeout_s = np.array([recordings[n].timeout_or(segment_timeout_s) for n in self.names])
        self.units = len(self.names)
        self.samples: list[tuple[np.ndarray, np.ndarray]] = []
        for n, (recording, t0) in zip(self.names, firsts, strict=True):
            end = by_name[n][-1].end_s
            if mode == "last_step":
                times = np.array([g.end_s for g in by_name[n]])
            else:
                times = recording.caps_t_s[(recording.caps_t_s > t0) & (recording.caps_t_s <= end)]
            self.samples.append((times - t0, recording.caps_at(times) - recording.caps_at(np.array([t0]))))
        self.span_s = max(float(s[0][-1]) for s in self.samples)

    def __call__(self, params: Params) -> LossValue:
        trace = self._rollout(params, self.span_s)
        defects, errors = [], []
        for r, (offsets, data_disp) in enumerate(self.samples):
            caps = trace.caps_at(torch.as_tensor(offsets))[r] - self.starts.caps_m[r]
            defect, error = _weighted_defects(caps[None], data_disp[None], self.config.loss.position_sigma_m)
            defects.append(defect[0])
            errors.append(error[0])
        return _every_window(torch.stack(defects), np.stack(errors))


class MultipleShootingLoss(_PolicyRollouts):
    """``n_windows`` equal windows per recording, each from the observation at its start,
    continuing the policy from the target being executed there; defects at the window ends."""

    name = "multiple_shooting"

    def __init__(
        self,
        engine: Engine,
        robot: RobotConfig,
        recordings: dict[str, Recording],
        gaits: list[Gait],
        params0: Params,
        config: SysidConfig,
        segment_timeout_s: float,
    ) -> None:
        self.engine, self.robot, self.config = engine, robot, config
        self.tick_s = 1.0 / robot.pid.control_rate_hz
        n = config.loss.shooting_windows
        starts, targets, ends = [], [], []
        for name in sorted({g.recording for g in gaits}):
            own = [g for g in gaits if g.recording == name]
            t0, t1 = own[0].start_s, own[-1].end_s
            self.length_s = (t1 - t0) / n
            for j in range(n):
                start = t0 + j * self.length_s
                current = max(k for k, g in enumerate(own) if g.start_s <= start + 1e-9)
                starts.append((recordings[name], start))
                targets.append([g.target for g in own[current:]])
                ends.append(recordings[name].caps_at(np.array([start + self.length_s]))[0])
        self.starts = window_starts(engine, params0, robot, starts, config.loss.settle_s)
        n_targets = max(len(t) for t in targets)
        self.targets = torch.tensor(np.stack([_padded(t, n_targets) for t in targets]))
        self.data_disp = np.stack(ends) - self.starts.data_caps_m
        self.segment_timeout_s = np.array([r.timeout_or(segment_timeout_s) for r, _ in starts])
        self.units = len(starts)

    def __call__(self, params: Params) -> LossValue:
        trace = self._rollout(params, self.length_s)
        tick = int(_tick_index(np.array([self.length_s]), self.tick_s, trace.caps_m.shape[1])[0])
        engine_disp = trace.caps_m[:, tick] - self.starts.caps_m
        return _every_window(*_weighted_defects(engine_disp, self.data_disp, self.config.loss.position_sigma_m))


def _padded(targets: list[np.ndarray], n: int) -> np.ndarray:
    """``targets`` (S, 6) padded to (n, 6) by repeating the last one: a hold (the KFL gives the
    padded segments a one-tick timeout, so they end at once even where that target was never
    reached; the other losses stop at their time span)."""
    rows = list(targets) + [targets[-1]] * (n - len(targets))
    return np.stack(rows)


def make_loss(
    engine: Engine,
    robot: RobotConfig,
    recordings: dict[str, Recording],
    gaits: list[Gait],
    params0: Params,
    config: SysidConfig,
    segment_timeout_s: float,
) -> TrajectoryLoss:
    """The loss ``config.loss.kind`` names. The policy rollouts (all losses but the KFL) hold each
    target at most its recording's ``segment_timeout_s``, else ``segment_timeout_s``."""
    if config.loss.kind == "kfl":
        return KeyFrameLoss(engine, robot, recordings, gaits, params0, config)
    if config.loss.kind == "multiple_shooting":
        return MultipleShootingLoss(engine, robot, recordings, gaits, params0, config, segment_timeout_s)
    return SequenceLoss(engine, robot, recordings, gaits, params0, config, segment_timeout_s, config.loss.kind)
