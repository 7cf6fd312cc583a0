"""System identification of the engine from tracked trajectories (DESIGN §1.4, seed 000 KFL)."""
