"""The config models' shared parts: the strict base model and the constrained number types."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
CapPair = tuple[Annotated[int, Field(ge=0, le=5)], Annotated[int, Field(ge=0, le=5)]]


class StrictModel(BaseModel):
    """Base model: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def updated(self, changes: dict[str, object]) -> Self:
        """A copy with ``changes`` (dotted keys such as ``start_fit.iterations``, values as the YAML
        would give them) applied and validated. Raises :class:`KeyError` naming a key that is no
        field, and pydantic's ``ValidationError`` for a value that does not fit its field."""
        data = self.model_dump()
        for key, value in changes.items():
            node = data
            *parents, last = key.split(".")
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
                if not isinstance(node, dict):
                    raise KeyError(f"'{key}': no field '{part}'")
            if last not in node:
                raise KeyError(f"'{key}': no field '{last}'")
            node[last] = value
        return type(self).model_validate(data)
