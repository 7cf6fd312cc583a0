"""The ``learn`` section of the pipeline config: the graph-network contact model and its training."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.config.base import Positive, StrictModel


class ContactModelConfig(StrictModel):
    """The graph network's shape (:mod:`pipeline.learned.network`); the hybrid graph-network paper
    used 128 numbers per latent and 4 message-passing steps at a 10 ms step."""

    dt_s: Positive = Field(
        default=0.005,
        description="Step of the learned engine (s); the control tick must be a whole number of steps. With "
        "spin 'analytic' it needs 5 ms; with 'held' 10 ms, the paper's step, is stable (docs/learned-contact.md).",
    )
    inner_nodes: Annotated[int, Field(ge=0, le=9)] = Field(
        default=3, description="Nodes on each rod's axis between its motors (besides the end caps and motors)."
    )
    contact_radius_m: Positive = Field(
        default=0.03, description="A node whose sphere is within this of the ground has a contact edge (m)."
    )
    latent: Annotated[int, Field(ge=4)] = Field(default=64, description="Numbers per node and edge latent.")
    message_passing_steps: Annotated[int, Field(ge=1)] = Field(default=3, description="Processor steps.")
    spin: Literal["held", "analytic"] = Field(
        default="analytic",
        description="Each rod's spin about its own axis, which the nodes on the axis cannot show: held at "
        "zero (each rod keeps its roll), or the analytic ground contact's (docs/learned-contact.md).",
    )
    inference_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="The network's precision in rollouts without gradients (training is float32): bfloat16 "
        "speeds up large batches on CPUs with AMX or AVX-512 BF16, not small ones (docs/learned-contact.md).",
    )
    compile_rollouts: bool = Field(
        default=False,
        description="Rollouts without gradients step through torch.compile: seconds to compile once per "
        "process and batch size, worth it for large batches (docs/learned-contact.md).",
    )
    lift_out_of_ground: bool = Field(
        default=True,
        description="After each step, lift a rod whose lowest sphere sinks below the ground back onto it, as the "
        "analytic engine's position correction does (false: the network alone keeps the rods out of the ground).",
    )


class CurriculumConfig(StrictModel):
    """Rollout lengths trained in turn, each with its epochs and learning rate."""

    lengths: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        default=(1, 2, 4, 8), min_length=1, description="Rollout lengths (control ticks) trained in turn."
    )
    epochs: tuple[Annotated[int, Field(ge=1)], ...] = Field(default=(8, 4, 2, 1), description="Epochs of each length.")
    learning_rates: tuple[Positive, ...] = Field(
        default=(1e-3, 5e-4, 2.5e-4, 1.25e-4), description="Adam learning rate of each length."
    )
    windows_per_epoch: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="At most this many training windows per epoch, drawn afresh each epoch (null: every "
        "window), so the cost of an epoch stops growing with the data.",
    )
    validate_every_epoch: bool = Field(
        default=False,
        description="Validate after every epoch (false: after each length's last epoch and after every epoch "
        "of the last length, which is where the kept checkpoint comes from unless the last length fails).",
    )

    @model_validator(mode="after")
    def _one_value_per_length(self) -> CurriculumConfig:
        n = len(self.lengths)
        if len(self.epochs) != n or len(self.learning_rates) != n:
            raise ValueError(f"epochs and learning_rates need one value per rollout length ({n})")
        return self


class PretrainConfig(StrictModel):
    """Pre-training on simulated rollouts with the robot config's values (cached per robot config
    and learn config, shared by every campaign in the runs folder)."""

    source: Literal["analytic", "mujoco"] = Field(
        default="analytic",
        description="What simulates the pre-training data: the analytic engine, or a MuJoCo model of the robot "
        "config (soft contact, MuJoCo's default torsional and rolling friction; the twin is MuJoCo too) "
        "(docs/learned-contact.md).",
    )
    random_policies: Annotated[int, Field(ge=2)] = Field(default=12, description="Random policies simulated.")
    targets: Annotated[int, Field(ge=1)] = Field(default=20, description="Targets of each random policy.")
    gait_cycles: Annotated[int, Field(ge=1)] = Field(
        default=3, description="Cycles of each published gait also simulated."
    )
    engine_dt_s: Positive = Field(
        default=0.005, description="Step of the analytic engine that makes the data (s; source 'analytic')."
    )
    curriculum: CurriculumConfig = CurriculumConfig(epochs=(8, 4, 2, 1))


class LearnConfig(StrictModel):
    """The ``learn`` stage: pre-training on simulated rollouts, then fine-tuning on the tracked
    recordings of the campaign so far, each with a curriculum of rollout lengths."""

    model: ContactModelConfig = ContactModelConfig()
    pretrain: PretrainConfig = PretrainConfig()
    fine_tune: CurriculumConfig = CurriculumConfig(
        lengths=(2, 4, 8), epochs=(6, 4, 4), learning_rates=(2e-4, 1e-4, 5e-5), windows_per_epoch=800
    )
    weight_decay: Annotated[float, Field(ge=0)] = Field(default=1e-4, description="AdamW weight decay.")
    gradient_clip: Positive = Field(default=1.0, description="Largest norm of a step's gradient.")
    noise_m: Annotated[float, Field(ge=0)] = Field(
        default=0.0005, description="Std of the noise on the training starts' rod centres (m; 0: none)."
    )
    batch_size: Annotated[int, Field(ge=1)] = Field(default=128, description="Windows per optimiser step.")
    validation_fraction: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.25,
        description="Pre-training: share of the simulated trajectories held out for validation. Fine-tuning "
        "validates on the gaits sysid holds out (sysid.data.holdout_fraction).",
    )
    smoothing_ticks: Annotated[int, Field(ge=0)] = Field(
        default=5,
        description="Tracked end caps are smoothed over this many ticks (Savitzky-Golay, quadratic) before "
        "their velocities are taken (0: raw).",
    )
    seed: int = 0
