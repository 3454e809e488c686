"""Seeing a plan: the program as a graph (graph.py) and one tensor's blocks
on its mesh as text (sharding_view.py)."""

from .graph import render, to_dot
from .sharding_view import sharding_text, visualize_sharding

__all__ = ["render", "sharding_text", "to_dot", "visualize_sharding"]
