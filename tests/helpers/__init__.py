"""Helpers that several test files share (test files import from here, never from one another)."""
