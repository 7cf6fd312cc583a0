"""Encode-process-decode graph network over a :class:`~pipeline.learned.graph.RobotGraph`.

Every multi-layer perceptron has two layers with a ReLU between them; all but the decoder end in
LayerNorm. One encoder per node and edge type lifts the (normalised) features to ``latent``
numbers; each of ``steps`` message-passing steps (weights not shared between steps) updates every
edge from its two nodes and itself, then every node from itself and the sums of its incoming
edges of each type, both with residual connections; the decoder maps each node to its velocity
change (3). The ground node's latent is a learned vector (it has no features of its own).

The graph is the same in every environment, so a batch is a leading dimension and the
aggregation is an ``index_add`` over the node dimension (plain torch: for a graph of a few dozen
nodes this serves batches faster than a flattened graph library batch; docs/learned-contact.md).
Shapes: B environments, N rod nodes, E_b body and E_c cable edges; the contact edges are one per
rod node, masked by ``contact`` (B, N).
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from pipeline.learned.graph import RobotGraph


class MLP(nn.Sequential):
    """Linear, ReLU, Linear, then LayerNorm unless ``norm`` is false."""

    def __init__(self, n_in: int, n_out: int, width: int, norm: bool = True) -> None:
        layers: list[nn.Module] = [nn.Linear(n_in, width), nn.ReLU(), nn.Linear(width, n_out)]
        if norm:
            layers.append(nn.LayerNorm(n_out))
        super().__init__(*layers)

    @property
    def first(self) -> nn.Linear:
        """The first linear layer."""
        return self[0]

    def after_first(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output for the first layer's output ``hidden`` (the rest of the layers on it)."""
        for layer in itertools.islice(self, 1, None):
            hidden = layer(hidden)
        return hidden


class Normaliser(nn.Module):
    """Zero mean, unit variance per feature, from statistics fitted once to training data
    (buffers: they travel with the state dict)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("std", torch.ones(size))

    def fit(self, samples: torch.Tensor) -> None:
        """Set the statistics from ``samples`` (..., size); a feature that never varies keeps std 1."""
        flat = samples.reshape(-1, samples.shape[-1]).to(self.mean.dtype)
        std = flat.std(0)
        self.mean.copy_(flat.mean(0))
        self.std.copy_(torch.where(std > 1e-9, std, torch.ones_like(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.std + self.mean


class ContactNetwork(nn.Module):
    """The graph network: features in, per-node velocity change (B, N, 3) in m/s out."""

    def __init__(self, graph: RobotGraph, sizes: dict[str, int], latent: int, steps: int) -> None:
        """``sizes``: the feature count of ``node``, ``body``, ``cable`` and ``contact``."""
        super().__init__()
        self.graph = graph
        self.sizes = dict(sizes)
        self.normalisers = nn.ModuleDict({kind: Normaliser(n) for kind, n in sizes.items()})
        self.target = Normaliser(3)
        self.encoders = nn.ModuleDict({kind: MLP(n, latent, latent) for kind, n in sizes.items()})
        self.ground = nn.Parameter(torch.zeros(latent))
        self.edge_updates = nn.ModuleList(
            nn.ModuleDict({kind: MLP(3 * latent, latent, latent) for kind in ("body", "cable", "contact")})
            for _ in range(steps)
        )
        self.node_updates = nn.ModuleList(MLP(4 * latent, latent, latent) for _ in range(steps))
        self.decoder = MLP(latent, 3, latent, norm=False)

    def forward(self, features: dict[str, torch.Tensor], contact: torch.Tensor) -> torch.Tensor:
        """Velocity changes (B, N, 3) m/s from ``features`` (kind -> (B, count, size), raw units)
        and the contact mask (B, N)."""
        g = self.graph
        latent = {kind: self.encoders[kind](self.normalisers[kind](x)) for kind, x in features.items()}
        nodes, body, cable, touch = latent["node"], latent["body"], latent["cable"], latent["contact"]
        mask = contact[..., None].to(nodes.dtype)
        for edge_update, node_update in zip(self.edge_updates, self.node_updates, strict=True):
            body, cable, touch = _edge_step(edge_update, nodes, body, cable, touch, self.ground, g)
            zero = torch.zeros_like(nodes)
            summed = [zero.index_add(1, g.body_dst, body), zero.index_add(1, g.cable_dst, cable), touch * mask]
            nodes = nodes + node_update(torch.cat([nodes, *summed], -1))
        return self.target.inverse(self.decoder(nodes))


def _edge_step(
    update: nn.ModuleDict,
    nodes: torch.Tensor,
    body: torch.Tensor,
    cable: torch.Tensor,
    touch: torch.Tensor,
    ground: torch.Tensor,
    g: RobotGraph,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One message-passing step's residual edge updates, each ``MLP`` applied to
    ``[sender, receiver, edge]`` (contact: ``[ground, node, edge]``).

    The first layer is split by its input blocks, so the sender and receiver terms are computed
    once per node (one matrix product for all edge types) and gathered to the edges, not
    computed per edge on a concatenated copy; the ground's term is a constant. Equal to the MLP
    on the concatenation up to rounding."""
    n = nodes.shape[-1]
    first = {kind: update[kind].first for kind in ("body", "cable", "contact")}
    w_body, w_cable, w_touch = (first[kind].weight for kind in ("body", "cable", "contact"))
    per_node = (
        nodes
        @ torch.cat(
            [w_body[:, :n], w_body[:, n : 2 * n], w_cable[:, :n], w_cable[:, n : 2 * n], w_touch[:, n : 2 * n]]
        ).T
    )
    body_src, body_dst, cable_src, cable_dst, touch_node = per_node.split(n, -1)
    hidden = {
        "body": body_src.index_select(1, g.body_src)
        + body_dst.index_select(1, g.body_dst)
        + nn.functional.linear(body, w_body[:, 2 * n :], first["body"].bias),
        "cable": cable_src.index_select(1, g.cable_src)
        + cable_dst.index_select(1, g.cable_dst)
        + nn.functional.linear(cable, w_cable[:, 2 * n :], first["cable"].bias),
        "contact": touch_node
        + nn.functional.linear(touch, w_touch[:, 2 * n :], first["contact"].bias + w_touch[:, :n] @ ground),
    }
    edges = {"body": body, "cable": cable, "contact": touch}
    return tuple(  # type: ignore[return-value]
        edges[kind] + update[kind].after_first(hidden[kind]) for kind in ("body", "cable", "contact")
    )
