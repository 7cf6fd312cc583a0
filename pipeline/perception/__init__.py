"""Perception: end-cap tracking from RGB-D frames and cable sensors (the ``track`` stage)."""
