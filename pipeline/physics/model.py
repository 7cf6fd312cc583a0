"""Static description of the robot for the engine: masses, inertia, body-fixed points.

Built once from a :class:`~pipeline.config.RobotConfig` (and attachment phases);
all tensors are constants of the simulation (no gradients), SI units.

Every point the engine needs is fixed in a rod: its two end-cap centres, its two
motor centres and its six cable attachment points. They are stored per rod in
``local_points`` (3, K, 3) and addressed by *flat* indices into the (3 * K) list,
so one batched product places all of them in the world each step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.config import RobotConfig
from pipeline.robot_model import N_CABLES, N_RODS, build_cables

POINTS_PER_ROD = 10  # 2 caps, 2 motors, 6 attachment points


@dataclass(frozen=True)
class RobotModel:
    """Per-rod rigid bodies and their points, as tensors.

    ``mass`` (3,) kg; ``inertia`` (3,) body-frame principal moments (kg m^2, z
    along the rod); ``local_points`` (3, K, 3) m; ``cap_index`` (6,) flat index of
    each end-cap centre; ``contact_index`` (P,), ``contact_radius`` (P,) m: the
    spheres that touch the ground (end caps, then motors); ``contact_incidence``
    (P, 3) one-hot contact-to-rod; ``cable_a``/``cable_b`` (9,) flat indices of
    each cable's two attachment points (actuated 0-5, passive 6-8).
    """

    robot: RobotConfig
    mass: torch.Tensor
    inertia: torch.Tensor
    local_points: torch.Tensor
    cap_index: torch.Tensor
    contact_index: torch.Tensor
    contact_radius: torch.Tensor
    contact_incidence: torch.Tensor
    cable_a: torch.Tensor
    cable_b: torch.Tensor

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
        mass = rod.mass_kg + 2 * cap.mass_kg + 2 * motor.mass_kg
        i_axial = rod.mass_kg * rod.radius_m**2 / 2 + 2 * (2 / 5) * cap.mass_kg * cap.radius_m**2
        i_axial += 2 * motor.mass_kg * motor.radius_m**2 / 2
        i_trans = rod.mass_kg * (3 * rod.radius_m**2 + rod.length_m**2) / 12
        i_trans += 2 * ((2 / 5) * cap.mass_kg * cap.radius_m**2 + cap.mass_kg * half**2)
        i_trans += 2 * (
            motor.mass_kg * (3 * motor.radius_m**2 + motor.length_m**2) / 12 + motor.mass_kg * motor.offset_m**2
        )

        cables = build_cables(robot, robot.attachment.phase_rad if phases_rad is None else phases_rad)
        points: list[list[tuple[float, float, float]]] = []
        cap_index = [0] * 6
        contact_index, contact_radius, contact_rod = [], [], []
        for r, (first, second) in enumerate(robot.topology.rods):
            base = r * POINTS_PER_ROD
            points.append(
                [(0.0, 0.0, -half), (0.0, 0.0, half), (0.0, 0.0, -motor.offset_m), (0.0, 0.0, motor.offset_m)]
            )
            cap_index[first], cap_index[second] = base, base + 1
            contact_index += [base, base + 1, base + 2, base + 3]
            contact_radius += [cap.radius_m, cap.radius_m, motor.radius_m, motor.radius_m]
            contact_rod += [r] * 4
        cable_a, cable_b = [0] * N_CABLES, [0] * N_CABLES
        for cable in cables:
            for end, slots in ((cable.a, cable_a), (cable.b, cable_b)):
                slots[cable.index] = end.rod * POINTS_PER_ROD + len(points[end.rod])
                points[end.rod].append(end.local_m)
        if any(len(p) != POINTS_PER_ROD for p in points):
            raise ValueError("every rod must carry exactly six cable attachment points")

        def t(values, kind=dtype):
            return torch.as_tensor(values, dtype=kind, device=device)

        return cls(
            robot=robot,
            mass=t([mass] * N_RODS),
            inertia=t([i_trans, i_trans, i_axial]),
            local_points=t(points),
            cap_index=t(cap_index, torch.long),
            contact_index=t(contact_index, torch.long),
            contact_radius=t(contact_radius),
            contact_incidence=torch.eye(N_RODS, dtype=dtype, device=device)[t(contact_rod, torch.long)],
            cable_a=t(cable_a, torch.long),
            cable_b=t(cable_b, torch.long),
        )
