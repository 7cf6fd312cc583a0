"""Exceptions for user-facing failures.

Every error the pipeline raises for bad input derives from :class:`R2S2RError`, so
the command line can print its message without a traceback.
"""


class R2S2RError(Exception):
    """Base class of errors caused by input, configuration or hardware state."""


class ConfigError(R2S2RError):
    """A configuration file is missing, unreadable, or fails validation."""


class DataError(R2S2RError):
    """A data file (trajectory, frames, manifest) does not match its contract."""


class PolicyError(R2S2RError):
    """A policy contains targets the robot cannot reach, or no policy can be made (no gait found)."""


class HardwareError(R2S2RError):
    """The hardware backend failed or disconnected while running."""
