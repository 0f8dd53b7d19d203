"""Gradients by hand and a tiny training loop."""
