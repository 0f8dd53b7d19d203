"""Decoding: the KV cache and generation."""
