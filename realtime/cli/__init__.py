"""The ``omni-realtime`` command line."""
