"""Deployments of the server beyond one process."""
