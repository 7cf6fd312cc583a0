"""Trajectory following (seed 002): paths of 2D waypoints and the action-table planner."""
