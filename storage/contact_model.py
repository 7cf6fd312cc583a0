"""The learned contact model on disk: one safetensors file holding the network's weights and
normalisation, with its config, the robot config's hash and the graph it was built for as
metadata (no pickled code: any later stage, or a user, loads it with :func:`load_contact_model`).

A file that cannot be read, that is no contact model, or whose graph does not match the robot it
is loaded for is refused with a :class:`~pipeline.errors.DataError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save

from pipeline.config import ContactModelConfig, RobotConfig, config_hash
from pipeline.errors import DataError
from pipeline.learned.engine import FEATURE_SIZES
from pipeline.learned.graph import RobotGraph
from pipeline.learned.network import ContactNetwork
from pipeline.physics.model import RobotModel
from storage.files import atomic_write_bytes

FORMAT = "r2s2r-contact-model/1"
"""The file format's name and version, in the file's metadata."""


def _graph_signature(graph: RobotGraph) -> dict[str, object]:
    """What must match between a model and the robot it runs: the nodes and the edges."""
    return {
        "node_z": [round(float(z), 6) for z in graph.node_z],
        "node_rod": graph.node_rod.tolist(),
        "body": [graph.body_src.tolist(), graph.body_dst.tolist()],
        "cable": [graph.cable_src.tolist(), graph.cable_dst.tolist()],
    }


def build_network(model: RobotModel, config: ContactModelConfig, seed: int = 0) -> ContactNetwork:
    """A new (untrained) network for ``model``'s robot, shaped by ``config``, its weights drawn
    from ``seed`` (the same seed, the same weights, whatever the process drew before; torch's
    global random state is left as it was)."""
    graph = RobotGraph.of(model, config.inner_nodes, config.contact_radius_m)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return ContactNetwork(graph, FEATURE_SIZES, config.latent, config.message_passing_steps)


def save_contact_model(
    path: Path,
    network: ContactNetwork,
    config: ContactModelConfig,
    robot: RobotConfig,
    metadata: dict[str, object],
) -> None:
    """Write ``network`` (trained with ``config`` for ``robot``) to ``path`` atomically; ``metadata``
    (JSON values: the training data, the figures) goes with it."""
    header = {
        "format": FORMAT,
        "config": json.dumps(config.model_dump(mode="json")),
        "robot_hash": config_hash(robot),
        "graph": json.dumps(_graph_signature(network.graph)),
        "metadata": json.dumps(metadata),
    }
    tensors = {name: value.detach().contiguous() for name, value in network.state_dict().items()}
    atomic_write_bytes(path, save(tensors, metadata=header))


def read_header(path: Path) -> dict[str, str]:
    """The metadata of the model file ``path`` (raises :class:`DataError` if it is none)."""
    try:
        with safe_open(str(path), "pt") as handle:
            header = handle.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise DataError(f"{path}: not a readable contact model file ({exc})") from exc
    if header.get("format") != FORMAT:
        raise DataError(f"{path}: not a contact model file (format {header.get('format')!r}, expected {FORMAT!r})")
    return header


def load_contact_model(path: Path, model: RobotModel) -> tuple[ContactNetwork, ContactModelConfig, dict[str, object]]:
    """The network in ``path``, built for ``model``'s robot, with its config and metadata.

    Raises :class:`DataError` naming ``path`` when it is unreadable or corrupt, or when its
    graph is not the graph of ``model``'s robot."""
    header = read_header(path)
    config = ContactModelConfig.model_validate_json(header["config"])
    network = build_network(model, config)
    expected = _graph_signature(network.graph)
    if json.loads(header["graph"]) != expected:
        raise DataError(
            f"{path}: the model's graph does not match robot '{model.robot.name}' "
            f"(its nodes or edges differ: trained for robot config {header['robot_hash']}, "
            f"this one is {config_hash(model.robot)})"
        )
    try:
        tensors = load_file(str(path))
        network.load_state_dict({name: value.to(torch.float32) for name, value in tensors.items()})
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise DataError(f"{path}: corrupt contact model file ({exc})") from exc
    return network, config, json.loads(header["metadata"])
