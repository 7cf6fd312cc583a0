"""Validated configuration models and their YAML loader: the package's public API.

Three kinds of file live under ``configs/``:

* ``robot/*.yaml`` -> :class:`RobotConfig`: what the pipeline knows about the robot
  (geometry, masses, topology, nominal cable and motor models, PID, sensors).
* ``hardware/*.yaml`` -> :class:`TwinConfig`: the MuJoCo twin's hidden "true"
  physical parameters. Only the twin backend and evaluation code read it.
* ``pipeline/*.yaml`` -> :class:`PipelineConfig`: which robot and hardware to use,
  where runs go, and per-stage settings (``sysid`` nested by the steps of identification).

All lengths are in metres, masses in kg, times in s, angles in rad unless a field
name says otherwise. Unknown keys are rejected so typos fail before anything runs.
"""

from pipeline.config.base import CapPair, Fraction, NonNegative, Positive, StrictModel
from pipeline.config.learned import ContactModelConfig, CurriculumConfig, LearnConfig, PretrainConfig
from pipeline.config.loading import (
    ROBOT_FIELD,
    LoadedConfigs,
    apply_overrides,
    config_hash,
    load_all,
    load_yaml,
    robot_with_overlay,
)
from pipeline.config.network import CameraSourceConfig, NetworkConfig
from pipeline.config.recordings import BagTopicsConfig
from pipeline.config.robot import (
    ActuatedCableConfig,
    AttachmentConfig,
    ContactConfig,
    EndCapConfig,
    FeasibilityConfig,
    MotorConfig,
    PassiveCableConfig,
    PIDConfig,
    RobotConfig,
    RodConfig,
    SensorConfig,
    TopologyConfig,
)
from pipeline.config.stages import (
    AttachConfig,
    CollectConfig,
    EngineConfig,
    GaitsConfig,
    GaitSearchConfig,
    PipelineConfig,
    RandomPolicyConfig,
    RedeployConfig,
    RunnerConfig,
    StartPoseConfig,
    TrackConfig,
)
from pipeline.config.sysid import (
    EngineParameter,
    GaitShootingConfig,
    GradientConfig,
    LatencyConfig,
    ParameterSearchConfig,
    PriorConfig,
    StartFitConfig,
    SysidConfig,
    SysidDataConfig,
    SysidLossConfig,
)
from pipeline.config.twin import (
    CameraConfig,
    GroundConfig,
    TwinCableConfig,
    TwinConfig,
    TwinMotorConfig,
    TwinPhysicsConfig,
    TwinSensorConfig,
)

__all__ = [
    "ROBOT_FIELD",
    "ActuatedCableConfig",
    "AttachConfig",
    "AttachmentConfig",
    "BagTopicsConfig",
    "CameraConfig",
    "CameraSourceConfig",
    "CapPair",
    "CollectConfig",
    "ContactConfig",
    "ContactModelConfig",
    "CurriculumConfig",
    "EndCapConfig",
    "EngineConfig",
    "EngineParameter",
    "FeasibilityConfig",
    "Fraction",
    "GaitSearchConfig",
    "GaitShootingConfig",
    "GaitsConfig",
    "GradientConfig",
    "GroundConfig",
    "LatencyConfig",
    "LearnConfig",
    "LoadedConfigs",
    "MotorConfig",
    "NetworkConfig",
    "NonNegative",
    "PIDConfig",
    "ParameterSearchConfig",
    "PassiveCableConfig",
    "PipelineConfig",
    "Positive",
    "PretrainConfig",
    "PriorConfig",
    "RandomPolicyConfig",
    "RedeployConfig",
    "RobotConfig",
    "RodConfig",
    "RunnerConfig",
    "SensorConfig",
    "StartFitConfig",
    "StartPoseConfig",
    "StrictModel",
    "SysidConfig",
    "SysidDataConfig",
    "SysidLossConfig",
    "TopologyConfig",
    "TrackConfig",
    "TwinCableConfig",
    "TwinConfig",
    "TwinMotorConfig",
    "TwinPhysicsConfig",
    "TwinSensorConfig",
    "apply_overrides",
    "config_hash",
    "load_all",
    "load_yaml",
    "robot_with_overlay",
]
