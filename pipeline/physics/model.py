"""Static description of the robot for the engine: masses, inertia, points, cables.

Built once from a :class:`~pipeline.config.RobotConfig` (and attachment phases);
all tensors are constants of the simulation (no gradients), SI units.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.config import RobotConfig
from pipeline.robot_model import N_RODS, build_cables


@dataclass(frozen=True)
class RobotModel:
    """Per-rod rigid bodies and the points the engine needs, as tensors.

    Shapes: ``mass`` (3,) kg; ``inertia`` (3,) body-frame principal moments (kg m^2,
    z along the rod); ``cap_rod`` (6,), ``cap_local`` (6, 3) m; ``contact_rod`` (P,),
    ``contact_local`` (P, 3), ``contact_radius`` (P,) spheres that touch the ground
    (end caps, then motors); ``cable_rod_a/b`` (9,), ``cable_local_a/b`` (9, 3);
    ``incidence_a/b`` (9, 3) one-hot cable-end-to-rod matrices.
    """

    robot: RobotConfig
    mass: torch.Tensor
    inertia: torch.Tensor
    cap_rod: torch.Tensor
    cap_local: torch.Tensor
    contact_rod: torch.Tensor
    contact_local: torch.Tensor
    contact_radius: torch.Tensor
    contact_incidence: torch.Tensor
    cable_rod_a: torch.Tensor
    cable_local_a: torch.Tensor
    cable_rod_b: torch.Tensor
    cable_local_b: torch.Tensor
    incidence_a: torch.Tensor
    incidence_b: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.mass.dtype

    @property
    def device(self) -> torch.device:
        return self.mass.device

    @classmethod
    def from_robot(
        cls,
        robot: RobotConfig,
        phases_rad: tuple[float, float, float] | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> RobotModel:
        """Rigid rods of rod + 2 end caps + 2 motors; cables attached on the cap surfaces.

        ``phases_rad`` sets the attachment ring of each rod (default: the robot config's).
        """
        rod, cap, motor = robot.rod, robot.end_cap, robot.motor
        half = rod.length_m / 2
        m = rod.mass_kg + 2 * cap.mass_kg + 2 * motor.mass_kg
        i_axial = rod.mass_kg * rod.radius_m**2 / 2 + 2 * (2 / 5) * cap.mass_kg * cap.radius_m**2
        i_axial += 2 * motor.mass_kg * motor.radius_m**2 / 2
        i_trans = rod.mass_kg * (3 * rod.radius_m**2 + rod.length_m**2) / 12
        i_trans += 2 * ((2 / 5) * cap.mass_kg * cap.radius_m**2 + cap.mass_kg * half**2)
        i_trans += 2 * (
            motor.mass_kg * (3 * motor.radius_m**2 + motor.length_m**2) / 12 + motor.mass_kg * motor.offset_m**2
        )

        def t(values, kind=dtype):
            return torch.as_tensor(values, dtype=kind, device=device)

        cap_rod, cap_local = [], []
        for c in range(6):
            r = next(i for i, pair in enumerate(robot.topology.rods) if c in pair)
            cap_rod.append(r)
            cap_local.append([0.0, 0.0, -half if robot.topology.rods[r][0] == c else half])
        contact_rod = [*cap_rod] + [r for r in range(N_RODS) for _ in range(2)]
        contact_local = [*cap_local] + [[0.0, 0.0, s * motor.offset_m] for _ in range(N_RODS) for s in (-1, 1)]
        contact_radius = [cap.radius_m] * 6 + [motor.radius_m] * (2 * N_RODS)
        cables = build_cables(robot, robot.attachment.phase_rad if phases_rad is None else phases_rad)
        rod_a = [c.a.rod for c in cables]
        rod_b = [c.b.rod for c in cables]
        eye = torch.eye(N_RODS, dtype=dtype, device=device)
        return cls(
            robot=robot,
            mass=t([m] * N_RODS),
            inertia=t([i_trans, i_trans, i_axial]),
            cap_rod=t(cap_rod, torch.long),
            cap_local=t(cap_local),
            contact_rod=t(contact_rod, torch.long),
            contact_local=t(contact_local),
            contact_radius=t(contact_radius),
            contact_incidence=eye[t(contact_rod, torch.long)],
            cable_rod_a=t(rod_a, torch.long),
            cable_local_a=t([c.a.local_m for c in cables]),
            cable_rod_b=t(rod_b, torch.long),
            cable_local_b=t([c.b.local_m for c in cables]),
            incidence_a=eye[t(rod_a, torch.long)],
            incidence_b=eye[t(rod_b, torch.long)],
        )
