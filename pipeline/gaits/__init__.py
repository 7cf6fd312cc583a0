"""Gaits: symmetry maps between faces and the published Tribar gaits."""
