"""Attention by Hand: multi-head attention, one tested step at a time."""
__version__ = "0.1.0"
