"""Observation of the engine: timeline, stall watch."""
