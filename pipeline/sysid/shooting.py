"""Gait-wise multiple shooting (Bock): the parameters refined with every gait's start state free.

The Key Frame Loss and its search compare each gait from a start state that is only estimated
(settled on the tracked pose, or fitted once at an earlier estimate), and those start errors
flatten the loss in friction and restitution (docs/sysid.md, *What limits it*). Here every fitted
gait of the Key Frame Loss is one window, started from its settled observation
(:func:`~pipeline.sysid.windows.window_starts`) moved by its own perturbation ``z_k`` (the 48
coordinates of :func:`~pipeline.sysid.start_fit.perturbed`) and run over the data's duration of
the gait with the gait's target (then the next gait's, if the engine is faster). The unknowns
are all the ``z_k`` and the parameters of a :class:`~pipeline.sysid.parameters.ParameterSpace`;
the residuals are:

* each window's tracked end caps and sensed cable lengths in their noise
  (:class:`~pipeline.sysid.start_fit.StartResiduals`, ``config.start_fit.caps_sigma_m`` and
  ``config.start_fit.cable_sigma_m``);
* the continuity defects between a window's end state and the start of the window of the next
  gait of the same recording, in the same 48 coordinates
  (:func:`~pipeline.sysid.start_fit.difference`), times a weight ``w``;
* a weak prior (:data:`~pipeline.sysid.start_fit.PRIOR_WEIGHT`) on each ``z_k``, and the
  configured priors of the parameters, ``(p - value) / scale``.

Levenberg-Marquardt with Marquardt's diagonal scaling and finite-difference Jacobians (every
window, every coordinate and parameter one environment of an engine batch; the engine's own
gradient through ground contact is too rough for this) solves the sparse block-tridiagonal
normal equations for all unknowns at once. The weight goes through ``config.gait_shooting.weights``
with ``config.gait_shooting.iterations`` steps each; then, ``config.gait_shooting.restarts`` times,
the starts are settled again at the answer and the weights run again. A window spans one gait, so
no rollout crosses many contact events, and continuity carries the information from gait to gait.

Measured on 60 s of engine data with tracking noise (motor speed 0.7, friction 0.5, restitution
0.3), from the robot config's values
(0.99 / 0.8 / 0.0):

* the parameters' Jacobian columns are central differences over :data:`PARAMETER_STEP` = 0.05 of
  a scale. With forward differences over 0.005 the step measured the residuals' roughness (a
  contact event moving by a tick): friction moved about 1 % of its value per step (30 s of data,
  motor speed and friction from 0.7 / 1.0, 8 steps: 0.907; forward over 0.05: 0.509; central over
  0.05: 0.509, motor speed 0.6997 against 0.7019);
* weight 0.3, 10 steps: random-policy seed 2 0.7023 / 0.5038 / 0.2984; seed 3 0.6970 / 0.4782 /
  0.2983, and on to 0.6970 / 0.4713 / 0.2975 where it stopped (22 steps, 262 s). Heavier weights
  after it moved away (3 and 10, 10 steps each: seed 2 0.6956 / 0.5030 / 0.2942, seed 3 0.6901 /
  0.4617 / 0.2964), so the default is 0.3 alone;
* seed 3's 0.471 is a local minimum of the starts fitted on the way: started at the truth, the
  same solve stays at 0.6986 / 0.5018 / 0.2966 with a lower cost (1.29 per residual against 1.43),
  and restarted from 0.471 with starts settled there it goes on to 0.6984 / 0.5037 / 0.2996 (12
  steps, 171 s); hence one restart by default.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse
import torch

from pipeline.config import SysidConfig
from pipeline.physics.engine import State
from pipeline.physics.params import Params
from pipeline.sysid.losses import KeyFrameLoss
from pipeline.sysid.parameters import ParameterSpace
from pipeline.sysid.result import Identification, Step
from pipeline.sysid.start_fit import (
    COORDINATES,
    DIFFERENCE_STEP,
    PRIOR_WEIGHT,
    LeadIn,
    StartResiduals,
    difference,
    perturbed,
)
from pipeline.sysid.windows import window_starts

log = logging.getLogger(__name__)

PARAMETER_STEP = 0.05
"""Central-difference step of a parameter, in its scaled coordinate (each side clamped into the
bounds). The residuals are rough in the parameters at the scale of a tick's contact event: a
step of 0.005 measured that roughness, not the trend, and friction moved about 1 % per step."""
GAITS_PER_BATCH = 24
"""Windows whose finite differences run as one engine batch (bounds the memory)."""
INITIAL_DAMPING = 1e-2
"""Levenberg-Marquardt damping of each weight's first step (relative to the normal matrix's diagonal)."""
MAX_DAMPING = 1e4
"""A step whose damping grew past this without lowering the cost ends the weight's steps (the
engine's residuals are rough at the scale of the steps left)."""
EXPANSIONS = 2
"""An accepted step is tried at twice and four times its length, and kept the longest that lowers
the cost more: the parameters move in small, consistent steps through the rough residuals."""
DAMPING_GROWTH = 4.0
"""Damping factor after a step that did not lower the cost (divided by 3 after one that did)."""
DIVERGED = 1e6
"""A data residual (in noise units) or end-state value (in its SI unit) beyond this, or one that is
not finite, means the engine diverged in the window's run; one such NaN would make every cost and
step of the solve NaN."""
PARTS = {
    "pos": (0, 9),
    "rotation": (9, 18),
    "vel": (18, 27),
    "omega": (27, 36),
    "rest_length": (36, 42),
    "motor_omega": (42, 48),
}
"""The continuity coordinates of each part of a state (their scales: ``start_fit.SCALES``)."""


@dataclass(frozen=True)
class ShootingFit:
    """What :meth:`GaitShooting.solve` found: the ``identification``, the data's cost (the sum of
    squared noise-weighted residuals; about ``residual_count`` at the truth) and the root mean
    square of the remaining continuity defects per part of a state (in the coordinates' scales)."""

    identification: Identification
    data_cost: float
    residual_count: int
    defect_rms: dict[str, float]
    dropped_windows: int


class GaitShooting:
    """The multiple-shooting problem of the fitted gaits of ``loss`` (its observed, unfitted
    chunks' gaits: lead-ins included) over ``space``'s parameters, settled at ``space``'s start.

    ``joined`` (K-1,): whether window ``k + 1`` is the gait after window ``k`` in the same
    recording (windows are in recording and gait order); only those pairs have continuity.
    ``kept`` (K,): the windows in the problem. One whose run diverged (:data:`DIVERGED`) at the
    start of a round or while its Jacobian is taken is dropped for the rest of the solve, with a
    warning: its data residuals and Jacobians are zero and it is joined to neither neighbour.
    ``initial``: the windows' residuals settled at ``space``'s start; ``residuals``: those of the
    round :meth:`solve` is in (settled again at each restart)."""

    def __init__(self, loss: KeyFrameLoss, space: ParameterSpace, config: SysidConfig) -> None:
        gaits = sorted(loss.observed.gaits, key=lambda g: (g.recording, g.index))
        self.space, self.config, self.gaits = space, config, gaits
        self.joined = np.array(
            [b.recording == a.recording and b.index == a.index + 1 for a, b in itertools.pairwise(gaits)],
            dtype=bool,
        )
        nexts = [b if joined else None for b, joined in zip(gaits[1:], self.joined, strict=True)] + [None]
        self.loss = loss
        self.targets = torch.tensor(
            np.stack([np.stack([g.target, (n or g).target]) for g, n in zip(gaits, nexts, strict=True)])
        )
        self.limits = np.array(
            [
                [loss.engine_limit_s(g), loss.engine_limit_s(n) if n else loss.tick_s]
                for g, n in zip(gaits, nexts, strict=True)
            ]
        )
        self.initial = self.settled_at(space.initial().numpy())
        self.residuals = self.initial
        self.windows = len(gaits)
        self.kept = np.ones(self.windows, dtype=bool)
        self.order = np.argsort(self.residuals.observed.last_tick.numpy(), kind="stable")

    def settled_at(self, theta: np.ndarray) -> StartResiduals:
        """The windows' residuals from their observed starts settled with parameters ``theta`` (P,)."""
        recordings = self.loss.recordings
        starts = window_starts(
            self.loss.engine,
            self.space.params(torch.as_tensor(theta, dtype=torch.float64)),
            self.loss.robot,
            [(recordings[g.recording], g.start_s) for g in self.gaits],
            self.config.loss.settle_s,
        )
        return StartResiduals(
            self.loss.engine,
            self.loss.robot,
            starts,
            [LeadIn(recordings[g.recording], g.start_s, g.duration_s) for g in self.gaits],
            self.targets,
            self.limits,
            self.config.start_fit.caps_sigma_m,
            self.config.start_fit.cable_sigma_m,
        )

    @property
    def dropped(self) -> int:
        """Number of windows dropped so far."""
        return int((~self.kept).sum())

    @property
    def linked(self) -> np.ndarray:
        """(K-1,) the pairs with continuity: joined, both windows kept."""
        return self.joined & self.kept[:-1] & self.kept[1:]

    def drop(self, diverged: np.ndarray) -> None:
        """Drop the kept windows where ``diverged`` (K,) is true, with a warning."""
        new = diverged & self.kept
        if new.any():
            self.kept &= ~new
            log.warning(
                "sysid: gait shooting drops %d of %d windows whose engine run diverged (%d dropped in all)",
                int(new.sum()),
                self.windows,
                self.dropped,
            )

    def checked(self, z: torch.Tensor, theta: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`evaluate` after dropping the windows whose residuals or end state diverge there."""
        data, ends = self._run(z, theta)
        self.drop((_diverged(data) | _diverged(ends.flat())).numpy())
        return self._masked(data, self._defects(ends, z))

    def _masked(self, data: torch.Tensor, defects: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``data`` (K, R) zero in the dropped windows, ``defects`` (K-1, 48) zero where not linked."""
        kept, linked = torch.as_tensor(self.kept)[:, None], torch.as_tensor(self.linked)[:, None]
        return torch.where(kept, data, torch.zeros_like(data)), torch.where(linked, defects, torch.zeros_like(defects))

    @property
    def size(self) -> int:
        """Number of parameters."""
        return len(self.space.names)

    def project(self, theta: np.ndarray) -> np.ndarray:
        """``theta`` (P,) clamped into the space's bounds."""
        return self.space.project(torch.as_tensor(theta, dtype=torch.float64).clone()).numpy()

    def _params(self, thetas: np.ndarray) -> Params:
        """One environment per row of ``thetas`` (N, P)."""
        return Params.concat([self.space.params(torch.as_tensor(t, dtype=torch.float64)) for t in thetas])

    def prior(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The parameters' prior residuals (Q,) and their Jacobian (Q, P) at ``theta``."""
        priors = {n: p for n, p in self.space.priors.items() if n in self.space.names}

        def residuals(t: np.ndarray) -> np.ndarray:
            values = self.space.values(torch.as_tensor(t, dtype=torch.float64))
            return np.array([(float(values[n]) - p.value) / p.scale for n, p in priors.items()])

        base = residuals(theta)
        jacobian = np.zeros((len(priors), self.size))
        for j in range(self.size):
            moved = theta.copy()
            moved[j] += PARAMETER_STEP
            jacobian[:, j] = (residuals(moved) - base) / PARAMETER_STEP
        return base, jacobian

    def evaluate(self, z: torch.Tensor, theta: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Every window's data residuals (K, R) and the continuity defects (K-1, 48) of start
        perturbations ``z`` (K, 48) and parameters ``theta`` (P,); zero in the dropped windows,
        and for the pairs not linked."""
        data, ends = self._run(z, theta)
        return self._masked(data, self._defects(ends, z))

    def _run(self, z: torch.Tensor, theta: np.ndarray) -> tuple[torch.Tensor, State]:
        """Every window's data residuals (K, R) and end state (K envs) of start perturbations
        ``z`` (K, 48) and parameters ``theta`` (P,)."""
        params = self._params(theta[None])
        data = torch.zeros(self.windows, 0, dtype=torch.float64)
        ends: list[State | None] = [None] * self.windows
        size = GAITS_PER_BATCH * (1 + COORDINATES + self.size)
        for first in range(0, self.windows, size):
            rows = self.order[first : first + size]
            res, end = self.residuals.run(z[rows], torch.as_tensor(rows), params.expand(len(rows)))
            if data.shape[1] == 0:
                data = torch.zeros(self.windows, res.shape[1], dtype=torch.float64)
            data[rows] = res
            for j, row in enumerate(rows):
                ends[row] = end.index(slice(j, j + 1))
        return data, State.concat(ends)

    def _defects(self, ends: State, z: torch.Tensor) -> torch.Tensor:
        """Continuity defects (K-1, 48): window k's end state minus window k+1's start, zero where
        the pair is not joined."""
        if self.windows < 2:
            return torch.zeros(0, COORDINATES, dtype=torch.float64)
        starts = perturbed(self.residuals.starts.state, z)
        gaps = difference(ends.index(slice(0, self.windows - 1)), starts.index(slice(1, self.windows)))
        return torch.where(torch.as_tensor(self.joined)[:, None], gaps, torch.zeros_like(gaps))

    def jacobians(self, z: torch.Tensor, theta: np.ndarray) -> dict[str, torch.Tensor]:
        """Jacobians: data (K, R, 48) and (K, R, P); continuity defect k in window k's start
        (K-1, 48, 48), window k+1's start (K-1, 48, 48) and the parameters (K-1, 48, P) (zero for
        unjoined pairs); and the residuals and defects where they are taken. Forward differences
        in the start coordinates, central differences (:data:`PARAMETER_STEP` either way, inside
        the bounds) in the parameters."""
        per = 1 + COORDINATES + 2 * self.size
        ups = slice(1 + COORDINATES, 1 + COORDINATES + self.size)
        downs = slice(1 + COORDINATES + self.size, per)
        steps = DIFFERENCE_STEP * torch.eye(COORDINATES, dtype=torch.float64)
        thetas = np.repeat(theta[None], per, 0)
        for j in range(self.size):
            thetas[ups.start + j, j] += PARAMETER_STEP
            thetas[downs.start + j, j] -= PARAMETER_STEP
        thetas = np.stack([self.project(t) for t in thetas])
        params = self._params(thetas)
        by_start: list[torch.Tensor | None] = [None] * self.windows
        by_params: list[torch.Tensor | None] = [None] * self.windows
        base: list[torch.Tensor | None] = [None] * self.windows
        ends: list[State | None] = [None] * self.windows
        parameter_steps = torch.as_tensor(np.diag(thetas[ups] - thetas[downs]).copy())[:, None]
        diverged = np.zeros(self.windows, dtype=bool)
        for first in range(0, self.windows, GAITS_PER_BATCH):
            rows = self.order[first : first + GAITS_PER_BATCH]
            moved = z[np.repeat(rows, per)].clone().reshape(len(rows), per, COORDINATES)
            moved[:, 1 : 1 + COORDINATES] += steps
            index = torch.arange(per).repeat(len(rows))
            res, end = self.residuals.run(
                moved.reshape(-1, COORDINATES),
                torch.as_tensor(np.repeat(rows, per)),
                Params(**{n: v[index] for n, v in params.as_dict().items()}),
            )
            res = res.reshape(len(rows), per, -1)
            diverged[rows] = (_diverged(res) | _diverged(end.flat().reshape(len(rows), -1))).numpy()
            for j, row in enumerate(rows):
                base[row] = res[j, 0]
                by_start[row] = ((res[j, 1 : 1 + COORDINATES] - res[j, :1]) / DIFFERENCE_STEP).T
                by_params[row] = ((res[j, ups] - res[j, downs]) / parameter_steps).T
                ends[row] = end.index(slice(j * per, (j + 1) * per))
        starts = perturbed(self.residuals.starts.state, z)
        self.drop(diverged)
        for row in np.flatnonzero(~self.kept):
            base[row], by_start[row], by_params[row] = (
                torch.zeros_like(t) for t in (base[row], by_start[row], by_params[row])
            )
        zero = torch.zeros(COORDINATES, COORDINATES, dtype=torch.float64)
        defects, cont_start, cont_next, cont_params = [], [], [], []
        for k in range(self.windows - 1):
            if not self.linked[k]:
                defects.append(torch.zeros(COORDINATES, dtype=torch.float64))
                cont_start += [zero]
                cont_next += [zero]
                cont_params.append(torch.zeros(COORDINATES, self.size, dtype=torch.float64))
                continue
            gaps = difference(ends[k], starts.index(torch.full((per,), k + 1)))
            defects.append(gaps[0])
            cont_start.append(((gaps[1 : 1 + COORDINATES] - gaps[:1]) / DIFFERENCE_STEP).T)
            cont_params.append(((gaps[ups] - gaps[downs]) / parameter_steps).T)
            shifted = perturbed(self.residuals.starts.state.index(torch.full((COORDINATES,), k + 1)), z[k + 1] + steps)
            at_end = ends[k].index(torch.zeros(COORDINATES, dtype=torch.long))
            cont_next.append(((difference(at_end, shifted) - gaps[:1]) / DIFFERENCE_STEP).T)
        empty = torch.zeros(0, COORDINATES, COORDINATES, dtype=torch.float64)
        return {
            "data": torch.stack(base),
            "data_start": torch.stack(by_start),
            "data_params": torch.stack(by_params),
            "defects": torch.stack(defects) if defects else torch.zeros(0, COORDINATES, dtype=torch.float64),
            "cont_start": torch.stack(cont_start) if cont_start else empty,
            "cont_next": torch.stack(cont_next) if cont_next else empty,
            "cont_params": torch.stack(cont_params) if cont_params else torch.zeros(0, COORDINATES, self.size),
        }

    def cost(
        self, data: torch.Tensor, defects: torch.Tensor, z: torch.Tensor, theta: np.ndarray, weight: float
    ) -> float:
        """Data, weighted continuity, start-prior and parameter-prior squares, summed."""
        prior, _ = self.prior(theta)
        return float(
            (data**2).sum() + ((weight * defects) ** 2).sum() + ((PRIOR_WEIGHT * z) ** 2).sum() + (prior**2).sum()
        )

    def normal(self, j: dict[str, torch.Tensor], theta: np.ndarray, weight: float) -> scipy.sparse.csc_matrix:
        """The Gauss-Newton normal matrix (K * 48 + P, K * 48 + P) of the Jacobians ``j`` taken at
        parameters ``theta``, continuity weighted by ``weight``, start and parameter priors included."""
        n, last = COORDINATES, self.windows * COORDINATES
        _, prior_jacobian = self.prior(theta)
        blocks: list[tuple[int, int, np.ndarray]] = [(last, last, prior_jacobian.T @ prior_jacobian)]
        for k in range(self.windows):
            jz, jp = j["data_start"][k].numpy(), j["data_params"][k].numpy()
            blocks += [(k * n, k * n, jz.T @ jz + PRIOR_WEIGHT**2 * np.eye(n)), (k * n, last, jz.T @ jp)]
            blocks += [(last, k * n, jp.T @ jz), (last, last, jp.T @ jp)]
        for k in np.flatnonzero(self.linked):
            a, b = weight * j["cont_start"][k].numpy(), weight * j["cont_next"][k].numpy()
            p = weight * j["cont_params"][k].numpy()
            here, there = k * n, (k + 1) * n
            blocks += [(here, here, a.T @ a), (there, there, b.T @ b), (here, there, a.T @ b), (there, here, b.T @ a)]
            blocks += [(here, last, a.T @ p), (last, here, p.T @ a), (there, last, b.T @ p), (last, there, p.T @ b)]
            blocks.append((last, last, p.T @ p))
        rows, cols, values = [], [], []
        for i, k, block in blocks:
            ii, kk = np.meshgrid(np.arange(block.shape[0]) + i, np.arange(block.shape[1]) + k, indexing="ij")
            rows.append(ii.ravel())
            cols.append(kk.ravel())
            values.append(block.ravel())
        size = last + self.size
        return scipy.sparse.coo_matrix(
            (np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), (size, size)
        ).tocsc()

    def gradient(self, j: dict[str, torch.Tensor], z: torch.Tensor, theta: np.ndarray, weight: float) -> np.ndarray:
        """The cost's half-gradient (K * 48 + P,) at starts ``z`` (K, 48) and parameters ``theta``
        (P,), where the Jacobians ``j`` and their residuals were taken."""
        n, last = COORDINATES, self.windows * COORDINATES
        prior, prior_jacobian = self.prior(theta)
        gradient = np.zeros(last + self.size)
        gradient[last:] += prior_jacobian.T @ prior
        for k in range(self.windows):
            jz, jp, r = j["data_start"][k].numpy(), j["data_params"][k].numpy(), j["data"][k].numpy()
            gradient[k * n : (k + 1) * n] += jz.T @ r + PRIOR_WEIGHT**2 * z[k].numpy()
            gradient[last:] += jp.T @ r
        for k in np.flatnonzero(self.linked):
            r = weight * j["defects"][k].numpy()
            gradient[k * n : (k + 1) * n] += weight * j["cont_start"][k].numpy().T @ r
            gradient[(k + 1) * n : (k + 2) * n] += weight * j["cont_next"][k].numpy().T @ r
            gradient[last:] += weight * j["cont_params"][k].numpy().T @ r
        return gradient

    def step(
        self, normal: scipy.sparse.csc_matrix, gradient: np.ndarray, damping: float
    ) -> tuple[torch.Tensor, np.ndarray]:
        """The Levenberg-Marquardt step (starts (K, 48), parameters (P,)) of the ``normal``
        equations with ``gradient`` and Marquardt's diagonal ``damping``.

        The starts' block is block-tridiagonal (each start meets only its neighbours'): it is
        eliminated by a banded Cholesky solve, the parameters' few columns by their Schur
        complement (on 60 s of engine data 0.04 s a step; a general sparse LU took 0.6 s)."""
        last = self.windows * COORDINATES
        scaled = (normal + damping * scipy.sparse.diags(normal.diagonal() + 1e-6)).tocsr()
        coupling = scaled[:last, last:].toarray()
        solved = scipy.linalg.solveh_banded(
            _upper_band(scaled[:last, :last]), np.column_stack([-gradient[:last], coupling])
        )
        schur = scaled[last:, last:].toarray() - coupling.T @ solved[:, 1:]
        dtheta = np.linalg.solve(schur, -gradient[last:] - coupling.T @ solved[:, 0])
        dz = solved[:, 0] - solved[:, 1:] @ dtheta
        return torch.tensor(dz.reshape(self.windows, COORDINATES)), dtheta

    def parameter_covariance(self, normal: scipy.sparse.csc_matrix) -> np.ndarray:
        """The parameters' covariance (P, P; scaled coordinates) from the Gauss-Newton ``normal``
        matrix: the inverse of its parameter block's Schur complement, the start perturbations
        marginalised out (the residuals are in their noise, so a unit cost per residual is the
        noise's own scatter)."""
        last = self.windows * COORDINATES
        matrix = normal.tocsr()
        coupling = matrix[:last, last:].toarray()
        solved = scipy.linalg.solveh_banded(_upper_band(matrix[:last, :last]), coupling)
        return np.linalg.inv(matrix[last:, last:].toarray() - coupling.T @ solved)

    def solve(self, progress: Callable[[Step], None] | None = None) -> ShootingFit:
        """Solve from the settled starts and the space's start, then ``config.gait_shooting.restarts``
        times again from starts settled at the answer (the start perturbations fitted while the
        parameters were far off hold the parameters in a local minimum: on seed 3 of the recovery
        data friction stopped at 0.471 and went on to 0.504 after a restart, truth 0.5).

        One history step (``method`` ``shooting``) per Levenberg-Marquardt iteration, at the point
        where its Jacobian is taken: ``loss`` the whole cost and ``unfiltered_loss`` the data's,
        both per data residual (about 1 at the truth), ``prior`` the parameters' prior squares,
        ``gradient`` the cost's half-gradient in the scaled parameters, ``lr`` the first damping
        tried. A weight's steps end early when no damping up to :data:`MAX_DAMPING` lowers the
        cost; ``converged``: the last weight's did (a stationary point of its cost, as far as the
        rough residuals tell)."""
        began = time.perf_counter()
        count = max(self.residuals.count, 1)
        theta = self.space.initial().numpy()
        history: list[Step] = []
        moved = False
        rounds = range(1 + self.config.gait_shooting.restarts)
        for restart, (order, weight) in itertools.product(rounds, enumerate(self.config.gait_shooting.weights)):
            if order == 0:
                self.residuals = self.settled_at(theta) if restart else self.initial
                z = torch.zeros(self.windows, COORDINATES, dtype=torch.float64)
                data, defects = self.checked(z, theta)
            current = self.cost(data, defects, z, theta, weight)
            damping = INITIAL_DAMPING
            for _ in range(self.config.gait_shooting.iterations):
                dropped = self.dropped
                jacobians = self.jacobians(z, theta)
                if self.dropped > dropped:  # the cost without the windows dropped there
                    data, defects = self._masked(data, defects)
                    current = self.cost(data, defects, z, theta, weight)
                normal = self.normal(jacobians, theta, weight)
                gradient = self.gradient(jacobians, z, theta, weight)
                prior, _ = self.prior(theta)
                step = Step(
                    iteration=len(history),
                    values={n: float(v) for n, v in self.space.values(torch.as_tensor(theta)).items()},
                    loss=current / count,
                    unfiltered_loss=float((data**2).sum()) / count,
                    prior=float((prior**2).sum()),
                    kept_fraction=float(self.kept.mean()),
                    gradient=dict(zip(self.space.names, gradient[z.numel() :].tolist(), strict=True)),
                    lr=damping,
                    wall_s=time.perf_counter() - began,
                    method="shooting",
                )
                history.append(step)
                if progress is not None:
                    progress(step)
                moved = False
                while damping <= MAX_DAMPING:
                    better = self._along(z, theta, *self.step(normal, gradient, damping), weight, current)
                    if better is not None:
                        current, z, theta, data, defects = better
                        damping, moved = damping / 3, True
                        break
                    damping *= DAMPING_GROWTH
                if not moved:
                    break
        joined = defects[torch.as_tensor(self.linked)]
        identification = Identification.at(
            self.space, torch.as_tensor(theta), history=history, converged=not moved, wall_s=time.perf_counter() - began
        )
        if history:  # the curvature where the last Jacobian was taken (the answer, unless the last step moved)
            spread = max(float((data**2).sum()) / count, 1.0)  # a misfit beyond the noise widens it
            variance = np.diag(self.parameter_covariance(normal)) * spread
            slopes = self.space.slopes(torch.as_tensor(theta))
            identification.standard_error = {
                n: float(np.sqrt(max(v, 0.0))) * abs(slopes[n]) for n, v in zip(self.space.names, variance, strict=True)
            }
        rms = {}
        for part, (a, b) in PARTS.items():
            rms[part] = float(joined[:, a:b].pow(2).mean().sqrt()) if len(joined) else 0.0
        return ShootingFit(identification, float((data**2).sum()), self.residuals.count, rms, self.dropped)

    def _along(
        self, z: torch.Tensor, theta: np.ndarray, dz: torch.Tensor, dtheta: np.ndarray, weight: float, current: float
    ) -> tuple[float, torch.Tensor, np.ndarray, torch.Tensor, torch.Tensor] | None:
        """The step (``dz``, ``dtheta``) from (``z``, ``theta``) if it lowers the cost below
        ``current``, lengthened by doubling while that lowers it further (at most
        :data:`EXPANSIONS` times): (cost, z, theta, data residuals, defects), or None."""
        best = None
        for length in 2.0 ** np.arange(EXPANSIONS + 1):
            moved_theta = self.project(theta + length * dtheta)
            data, defects = self.evaluate(z + length * dz, moved_theta)
            cost = self.cost(data, defects, z + length * dz, moved_theta, weight)
            if not cost < (current if best is None else best[0]):  # a NaN (diverged) cost is no better
                break
            best = (cost, z + length * dz, moved_theta, data, defects)
        return best


def _upper_band(matrix: scipy.sparse.spmatrix) -> np.ndarray:
    """The upper triangle of the symmetric sparse ``matrix`` (N, N) in LAPACK's banded storage
    ((u + 1, N), ``u`` its bandwidth), as :func:`scipy.linalg.solveh_banded` reads it."""
    upper = scipy.sparse.triu(matrix).tocoo()
    width = int((upper.col - upper.row).max(initial=0))
    band = np.zeros((width + 1, matrix.shape[0]))
    np.add.at(band, (width + upper.row - upper.col, upper.col), upper.data)
    return band


def _diverged(values: torch.Tensor) -> torch.Tensor:
    """(N,) bool: whether row ``n`` of ``values`` (N, ...) has an entry that is not finite or
    beyond :data:`DIVERGED`."""
    flat = values.flatten(1)
    return ~(torch.isfinite(flat) & (flat.abs() <= DIVERGED)).all(1)
