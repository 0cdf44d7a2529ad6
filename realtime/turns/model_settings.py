"""How the server runs ``semantic_vad``'s turn model: whether at all, its CPU threads, and the scorer's batch and queue
limits. Pure (no model, no I/O): :class:`realtime.config.ServerConfig` holds one, ``omni-realtime serve`` sets it from
its ``--turn-model-*`` flags, :mod:`realtime.server.turn_model` applies it."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_THREADS = 1
"""onnxruntime intra-op threads of the model: the calling thread alone (the cores serve every session's audio and the
engine; one call on a few 8 s turns takes ~10-65 ms on one core)."""
DEFAULT_MAX_BATCH = 8
"""Requests one model call takes at most (the sessions whose silences began while the last call ran)."""
DEFAULT_MAX_WAITING = 16
"""Requests that wait at most for their call (not counting the running one); more are answered "unknown" at once and
their turns end on silence alone. With :data:`DEFAULT_MAX_BATCH`, a request waits at most two calls before its own."""


@dataclass(frozen=True)
class TurnModelSettings:
    """The server's turn model (see the module docstring). ``enabled`` false: no model is loaded; ``semantic_vad``
    sessions end their turns on silence alone (each eagerness's ``unscored_wait_ms``). Invalid values raise
    ``ValueError`` naming the setting."""

    enabled: bool = True
    threads: int = DEFAULT_THREADS
    max_batch: int = DEFAULT_MAX_BATCH
    max_waiting: int = DEFAULT_MAX_WAITING

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"turn_model.enabled must be true or false, got {self.enabled!r}")
        for name in ("threads", "max_batch", "max_waiting"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"turn_model.{name} must be a positive integer, got {value!r}")
