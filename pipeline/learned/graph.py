"""The robot as a graph for the learned contact model (the hybrid graph-network paper's object
graph): nodes along each rod's axis, body edges within a rod, cable edges between the end caps a
cable joins, and a ground node with a contact edge to every rod node.

Node ``k`` of rod ``r`` sits at ``z_k`` on the rod's body z axis: its two end caps (the rod's
ends), its two motors, and ``inner_nodes`` points spaced evenly between the motors. Body edges
join neighbours along the rod, both ways; cable edges join the two end-cap nodes of each of the
nine cables, both ways. Contact edges go from the ground node to every rod node; which of them
exist at a state is a mask (a node whose sphere is within ``contact_radius_m`` of the ground),
so the graph's shapes never change and a batch of robots is one tensor per feature.

Shapes: ``N`` rod nodes (``3 * per_rod``), the ground node is index ``N``; ``E_b`` body edges,
``E_c`` cable edges, ``N`` contact edges (one per rod node). Units SI.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.physics.model import RobotModel
from pipeline.robot_model import N_RODS, cable_pairs, rod_of_cap


@dataclass(frozen=True)
class RobotGraph:
    """The fixed part of the graph. ``node_rod`` (N,) rod of each node; ``node_z`` (N,) m its place
    on the rod's axis; ``node_radius`` (N,) m the sphere that can touch the ground there (end cap,
    motor or bar); ``node_inv_mass`` (N,) 1/kg the inverse of the mass it stands for; ``cap_node``
    (6,) the node of each end cap; ``body_src``/``body_dst`` (E_b,), ``cable_src``/``cable_dst``
    (E_c,) the edges, messages flowing from ``src`` to ``dst``; ``cable_of_edge`` (E_c,) which of
    the nine cables each cable edge is; ``contact_radius_m`` the reach of a contact edge."""

    node_rod: torch.Tensor
    node_z: torch.Tensor
    node_radius: torch.Tensor
    node_inv_mass: torch.Tensor
    cap_node: torch.Tensor
    body_src: torch.Tensor
    body_dst: torch.Tensor
    cable_src: torch.Tensor
    cable_dst: torch.Tensor
    cable_of_edge: torch.Tensor
    contact_radius_m: float

    @property
    def n_nodes(self) -> int:
        """Rod nodes (the ground node not counted)."""
        return int(self.node_rod.shape[0])

    @property
    def per_rod(self) -> int:
        return self.n_nodes // N_RODS

    @classmethod
    def of(cls, model: RobotModel, inner_nodes: int, contact_radius_m: float) -> RobotGraph:
        """The graph of ``model``'s robot with ``inner_nodes`` nodes between each rod's motors."""
        robot = model.robot
        half = robot.rod.length_m / 2
        offset = robot.motor.offset_m
        inner = [-offset + 2 * offset * (i + 1) / (inner_nodes + 1) for i in range(inner_nodes)]
        z = [-half, -offset, *inner, offset, half]
        radius = [robot.end_cap.radius_m, robot.motor.radius_m]
        radius = [*radius, *[robot.rod.radius_m] * inner_nodes, *reversed(radius)]
        bar_share = robot.rod.mass_kg / len(z)
        mass = [robot.end_cap.mass_kg, robot.motor.mass_kg, *[0.0] * inner_nodes, robot.motor.mass_kg]
        mass = [m + bar_share for m in [*mass, robot.end_cap.mass_kg]]
        per_rod = len(z)
        dtype, device = model.dtype, model.device
        cap_node = [0] * 6
        for r, (first, second) in enumerate(robot.topology.rods):
            cap_node[first], cap_node[second] = r * per_rod, r * per_rod + per_rod - 1
        body = [(r * per_rod + k, r * per_rod + k + 1) for r in range(N_RODS) for k in range(per_rod - 1)]
        body_src = [a for a, b in body] + [b for a, b in body]
        body_dst = [b for a, b in body] + [a for a, b in body]
        pairs = cable_pairs(robot)
        rods = rod_of_cap(robot)
        if any(rods[a] == rods[b] for a, b in pairs):
            raise ValueError("a cable joins the two end caps of one rod; the graph needs caps of different rods")
        cable_src = [cap_node[a] for a, _ in pairs] + [cap_node[b] for _, b in pairs]
        cable_dst = [cap_node[b] for _, b in pairs] + [cap_node[a] for a, _ in pairs]

        def t(values: list, kind: torch.dtype = dtype) -> torch.Tensor:
            return torch.as_tensor(values, dtype=kind, device=device)

        return cls(
            node_rod=t([r for r in range(N_RODS) for _ in range(per_rod)], torch.long),
            node_z=t(z * N_RODS),
            node_radius=t(radius * N_RODS),
            node_inv_mass=t([1.0 / m for m in mass] * N_RODS),
            cap_node=t(cap_node, torch.long),
            body_src=t(body_src, torch.long),
            body_dst=t(body_dst, torch.long),
            cable_src=t(cable_src, torch.long),
            cable_dst=t(cable_dst, torch.long),
            cable_of_edge=t(list(range(len(pairs))) * 2, torch.long),
            contact_radius_m=contact_radius_m,
        )

    def node_positions(self, pos: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
        """World positions (B, N, 3) of the nodes of rods at ``pos`` (B, 3, 3) with rotation
        matrices ``rotations`` (B, 3, 3, 3) (columns: the body axes in the world)."""
        axis = rotations[..., 2].index_select(1, self.node_rod)
        return pos.index_select(1, self.node_rod) + self.node_z[None, :, None] * axis

    def clearance(self, nodes: torch.Tensor) -> torch.Tensor:
        """Height (B, N) m of each node's sphere above the ground (negative: into it)."""
        return nodes[..., 2] - self.node_radius

    def contact_mask(self, nodes: torch.Tensor) -> torch.Tensor:
        """Which contact edges exist (B, N): the node's sphere is within ``contact_radius_m`` of
        the ground."""
        return self.clearance(nodes) < self.contact_radius_m
