"""Mechanisms: calibrate (public metadata only) and release (bounded aggregates + noise)."""
