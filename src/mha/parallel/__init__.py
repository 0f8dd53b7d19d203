"""Attention across devices: ring attention, Ulysses and the launcher."""
