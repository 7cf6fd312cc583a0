"""The hybrid engine: analytic motors, cables and gravity, learned ground contact.

:class:`LearnedEngine` is an :class:`~pipeline.physics.engine.Engine` whose ground contact is a
:class:`~pipeline.learned.network.ContactNetwork` (the hybrid graph-network paper's "analytic
passive forces + graph-network contact"). A step:

1. :meth:`~pipeline.physics.engine.Engine.free_motion`: motors, cable forces and gravity give the
   rods' velocities without contact, as in the analytic engine;
2. the graph's features (:func:`features`) from the state and those velocities; the network
   predicts each node's velocity change from contact;
3. the rigid motion that best fits those node velocity changes (:meth:`LearnedEngine.rigid_fit`:
   least squares over each rod's nodes) is added to the free velocities. Nodes on the axis cannot
   show a rod's spin about its own axis; with ``spin="held"`` it is held at zero, so each rod keeps
   the roll it starts with (the light rod's spin under the cables' torques about its axis is too
   stiff for explicit steps of 10 ms: the analytic engine, stepped at 10 ms from the twin's states
   with their true spins, diverges; docs/learned-contact.md); with ``spin="analytic"`` it is the
   analytic engine's after its ground impulses (:meth:`Engine._ground_contact
   <pipeline.physics.engine.Engine._ground_contact>`), stable at 5 ms, so the cables' attachment
   points turn as the rods roll;
4. contact between rods and the integration of positions, as in the analytic engine; with
   ``lift_out_of_ground``, the analytic engine's position correction then lifts a rod whose lowest
   sphere sank below the ground back onto it. Training rolls out without it
   (:meth:`LearnedEngine.unlifted`): the correction is not differentiable, and a network trained
   behind it learns to sink.

Same :class:`~pipeline.physics.engine.State`, same rollouts with the firmware PID
(:mod:`pipeline.physics.rollout`), batched and differentiable. Shapes as in
:mod:`pipeline.learned.graph`; units SI.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from pipeline.config import ContactModelConfig
from pipeline.learned.graph import RobotGraph
from pipeline.learned.network import ContactNetwork
from pipeline.physics.engine import Engine, FreeMotion, State, cross
from pipeline.physics.model import RobotModel
from pipeline.physics.params import Params
from pipeline.robot_model import N_ACTUATED, N_RODS

FEATURE_SIZES = {"node": 9, "body": 8, "cable": 14, "contact": 7}
"""Features per node and edge type (:func:`features`)."""


def node_velocities(graph: RobotGraph, vel: torch.Tensor, omega: torch.Tensor, arms: torch.Tensor) -> torch.Tensor:
    """Velocities (B, N, 3) of the nodes with lever ``arms`` (B, N, 3) of rods moving with ``vel``,
    ``omega`` (B, 3, 3)."""
    return vel.index_select(1, graph.node_rod) + cross(omega.index_select(1, graph.node_rod), arms)


def features(
    graph: RobotGraph,
    params: Params,
    state: State,
    free: FreeMotion,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The graph's features at ``state`` with the step's free motion ``free``; also the nodes'
    free velocities (B, N, 3) and the contact mask (B, N).

    * node (9): velocity (3, the state's: the finite-difference velocity of the last step),
      velocity change from cables and gravity this step (3), clearance above the ground, inverse
      mass, sphere radius;
    * body edge (8): displacement from sender to receiver (3) and its length, the same in the
      undeformed rod's frame (3) and its length;
    * cable edge (14): displacement (3), length, unit direction (3), relative velocity (3), rest
      length, stiffness, damping (the cable's parameters) and tension (N);
    * contact edge (7): clearance, normal and tangential velocity of the node (1 + 2, the normal
      being the ground's z), the same for its free velocity.
    """
    g = graph
    batch = state.batch_size
    rotations = free.rotations
    nodes = g.node_positions(state.pos, rotations)
    arms = nodes - state.pos.index_select(1, g.node_rod)
    v = node_velocities(g, state.vel, state.omega, arms)
    v_free = node_velocities(g, free.vel, free.omega, arms)
    clearance = g.clearance(nodes)
    per_node = torch.stack([g.node_inv_mass, g.node_radius], -1).expand(batch, -1, -1)
    node = torch.cat([v, v_free - v, clearance[..., None], per_node], -1)

    d = nodes.index_select(1, g.body_dst) - nodes.index_select(1, g.body_src)
    undeformed = torch.zeros_like(d)
    undeformed[..., 2] = g.node_z[g.body_dst] - g.node_z[g.body_src]
    body = torch.cat([d, d.norm(dim=-1, keepdim=True), undeformed, undeformed.norm(dim=-1, keepdim=True)], -1)

    d = nodes.index_select(1, g.cable_dst) - nodes.index_select(1, g.cable_src)
    length = d.norm(dim=-1, keepdim=True)
    relative = v.index_select(1, g.cable_dst) - v.index_select(1, g.cable_src)
    cable = g.cable_of_edge
    actuated = cable < N_ACTUATED
    rest = torch.where(
        actuated,
        free.rest_length[:, cable.clamp(max=N_ACTUATED - 1)],
        params.passive_rest_length[:, None],
    )
    stiffness = torch.where(actuated, params.actuated_stiffness[:, None], params.passive_stiffness[:, None])
    damping = torch.where(actuated, params.actuated_damping[:, None], params.passive_damping[:, None])
    cable_features = torch.cat(
        [d, length, d / length, relative, torch.stack([rest, stiffness, damping, free.tension[:, cable]], -1)], -1
    )

    def split(velocity: torch.Tensor) -> torch.Tensor:
        return torch.cat([velocity[..., 2:], velocity[..., :2]], -1)

    contact = torch.cat([clearance[..., None], split(v), split(v_free)], -1)
    return (
        {"node": node, "body": body, "cable": cable_features, "contact": contact},
        v_free,
        g.contact_mask(nodes),
    )


class LearnedEngine(Engine):
    """An :class:`~pipeline.physics.engine.Engine` with ``network``'s ground contact; ``dt`` (s) the
    step the network was trained at; ``spin`` the rods' spin about their axes, ``"held"`` or
    ``"analytic"`` (step 3 above); ``lift_out_of_ground`` whether step 4 corrects positions. Steps
    with gradients run eagerly in float32; without, the network runs in ``inference_dtype``
    (``torch.float32`` or ``torch.bfloat16``), and with ``compiled`` the step runs through
    ``torch.compile`` (compiled on first use, per batch size)."""

    def __init__(
        self,
        model: RobotModel,
        network: ContactNetwork,
        dt: float,
        spin: str,
        lift_out_of_ground: bool = True,
        inference_dtype: torch.dtype = torch.float32,
        compiled: bool = False,
        gravity_m_s2: float = 9.81,
    ) -> None:
        if spin not in ("held", "analytic"):
            raise ValueError(f"spin: expected 'held' or 'analytic', got {spin!r}")
        if inference_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"inference_dtype: expected torch.float32 or torch.bfloat16, got {inference_dtype}")
        super().__init__(model, dt=dt, gravity_m_s2=gravity_m_s2, compiled=False)
        self.spin = spin
        self.lift_out_of_ground = lift_out_of_ground
        self.inference_dtype = inference_dtype
        self._compiled_advance = torch.compile(self.advance) if compiled else None
        self.network = network
        self.graph = network.graph
        z = self.graph.node_z.reshape(N_RODS, -1)
        centred = z - z.mean(-1, keepdim=True)
        self._z_mean = z.mean(-1)  # (3,) per rod
        self._z_weight = centred / (centred**2).sum(-1, keepdim=True)  # (3, P): least-squares slope weights

    @classmethod
    def of(cls, model: RobotModel, network: ContactNetwork, config: ContactModelConfig) -> LearnedEngine:
        """The engine of ``model`` with ``network`` and ``config``'s (``learn.model``) step, spin, lift
        and rollout precision and compilation."""
        return cls(
            model,
            network,
            config.dt_s,
            config.spin,
            config.lift_out_of_ground,
            getattr(torch, config.inference_dtype),
            config.compile_rollouts,
        )

    def steps(self, params: Params, state: State, control: torch.Tensor, n: int) -> State:
        """``n`` steps of ``dt`` with ``control`` (B, 6), compiled where the engine says and no
        gradient is taken."""
        advance = self.advance
        if self._compiled_advance is not None and not torch.is_grad_enabled():
            advance = self._compiled_advance
        for _ in range(n):
            state = advance(params, state, control)
        return state

    def advance(self, params: Params, state: State, control: torch.Tensor) -> State:
        free = self.free_motion(params, state, control)
        velocity_change = self.contact_velocity_change(params, state, free)
        d_vel, d_omega = self.rigid_fit(velocity_change, free.rotations)
        axis = free.rotations[..., 2]
        omega = free.omega + d_omega
        omega = omega - (omega * axis).sum(-1, keepdim=True) * axis
        if self.spin == "analytic":
            _, contact_omega, _ = self._ground_contact(params, state, free.vel, free.omega, free.rotations, free.arms)
            omega = omega + (contact_omega * axis).sum(-1, keepdim=True) * axis
        ground = None
        if self.lift_out_of_ground:
            ground = torch.zeros(
                state.batch_size, len(self._contact_rod), dtype=state.pos.dtype, device=state.pos.device
            )
        return self.finish(state, free, free.vel + d_vel, omega, ground)

    @contextmanager
    def unlifted(self) -> Iterator[LearnedEngine]:
        """This engine without step 4's position correction while the context lasts (training's
        rollouts: the network alone must keep the rods out of the ground)."""
        lift, self.lift_out_of_ground = self.lift_out_of_ground, False
        try:
            yield self
        finally:
            self.lift_out_of_ground = lift

    def contact_velocity_change(self, params: Params, state: State, free: FreeMotion) -> torch.Tensor:
        """The network's velocity change (B, N, 3) m/s of each node from ground contact this step."""
        graph_features, _, contact = features(self.graph, params, state, free)
        dtype = next(self.network.parameters()).dtype
        inputs = {k: v.to(dtype) for k, v in graph_features.items()}
        low = self.inference_dtype == torch.bfloat16 and not torch.is_grad_enabled()
        with torch.autocast(state.pos.device.type, dtype=torch.bfloat16, enabled=low):
            change = self.network(inputs, contact)
        return change.to(state.pos.dtype)

    def rigid_fit(self, node_change: torch.Tensor, rotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The change of each rod's velocity and angular velocity (each (B, 3, 3), world) whose
        node velocities fit ``node_change`` (B, N, 3) best in least squares, with no change of the
        spin about the rod's axis (nodes on the axis do not show it)."""
        batch = node_change.shape[0]
        per_rod = rotations.index_select(1, self.graph.node_rod)  # (B, N, 3, 3)
        body = self._to_body(per_rod, node_change).reshape(batch, N_RODS, -1, 3)
        mean = body.mean(2)
        slope = (body * self._z_weight[None, :, :, None]).sum(2)  # d(change)/dz per rod, body frame
        d_omega_body = torch.stack([-slope[..., 1], slope[..., 0], torch.zeros_like(slope[..., 0])], -1)
        lever = torch.zeros_like(mean)
        lever[..., 2] = self._z_mean
        d_vel_body = mean - cross(d_omega_body, lever)
        return self._to_world(rotations, d_vel_body), self._to_world(rotations, d_omega_body)
