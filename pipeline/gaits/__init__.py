"""Gaits: symmetry of the prism, the published Tribar gaits, the gait search in the engine, expansion
to long policies, transition smoothing, and what a policy does in the engine."""
