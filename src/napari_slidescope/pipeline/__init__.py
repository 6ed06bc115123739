"""Regions, tile plans, the staged runner, and the public analysis functions."""
