"""System identification of the engine from tracked trajectories (the R2S2R paper's Key Frame Loss)."""
