"""Timing, FLOPs, HBM traffic and hardware figures."""
