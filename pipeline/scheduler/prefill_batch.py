"""The thinker prefill chunks of one engine step, gathered so that they run together.

Each step the engine plans at most one chunk per conversation (a response's prompt, or the speech of a user still
talking), admits them here under two budgets, then runs the admitted ones as one batch
(:meth:`~pipeline.runners.thinker.ThinkerRunner.prefill_many`): a burst of turns ending together costs one replay of
a prefill graph instead of one eager prefill each.

Budgets: ``max_jobs`` chunks (the stage's ``max_prefills_per_step``) and ``max_rows`` positions (the largest captured
prefill graph, so an admitted batch replays one graph; None: no row budget, as on the CPU). A chunk longer than
``max_rows`` is admitted only as the first of its step, and then runs alone, eagerly. What is not admitted waits for
the next step. Pure bookkeeping: no torch calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.models.positions import GridSpan

if TYPE_CHECKING:  # annotations only: the scheduler runs no tensor code
    import numpy as np
    import torch

__all__ = ["PrefillBatch", "PrefillJob"]


@dataclass
class PrefillJob:
    """One chunk: positions ``start .. start + len(keys) - 1`` of conversation ``conv_id``'s rendering, into thinker
    KV slot ``slot``, as plain data; the thinker runner builds its input vectors (token embeddings, with the audio
    encoder's outputs at audio positions: the encoders' output tensors are the only values the chunk refers to)."""

    conv_id: str
    slot: int
    keys: list
    """The rendering's keys of the chunk (what the conversation's cache holds once it ran)."""
    token_ids: list[int]
    """The chunk's token ids (audio positions hold the audio placeholder id)."""
    audio: list[tuple[int, torch.Tensor, range]]
    """Audio runs ``(offset in the chunk, encoder output, its rows)``: consecutive positions holding consecutive rows
    of one encoded block."""
    start: int
    last: bool
    """The chunk reaches the end of the rendering."""
    logits: bool
    """The last position's logits are needed (a response's final chunk: its first reply token)."""
    response_id: str | None = None
    """The response whose prompt this is (None: a background prefill of an idle conversation)."""
    rope: np.ndarray | None = None
    """(3, rows) int64 numpy array of the chunk's TMRoPE positions (None: the cache indices, as without pictures)."""
    rope_shift: int | None = 0
    """Rope position - cache index of text after the chunk (what decode rows add once it ran); None: the chunk ends
    inside a span of explicit positions."""
    deepstack: list[tuple[int, tuple, range]] = field(default_factory=list)
    """Runs ``(offset in the chunk, a block's per-layer features, its rows)`` of the picture and video positions whose
    vision tower adds features to the first decoder layers' outputs (one tensor per layer in each tuple)."""
    spans: list[GridSpan] = field(default_factory=list)
    """The rendering's explicit-position spans that hold some of the chunk's positions, in order (the conversation
    keeps them with its cache)."""

    @property
    def rows(self) -> int:
        return len(self.keys)


@dataclass
class PrefillBatch:
    max_jobs: int
    max_rows: int | None
    jobs: list[PrefillJob] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(job.rows for job in self.jobs)

    def has_room(self) -> bool:
        """Whether another chunk may still be planned this step (the job budget)."""
        return len(self.jobs) < self.max_jobs and not self._oversized()

    def admit(self, job: PrefillJob) -> bool:
        """Add ``job`` if both budgets allow it (see the module docstring)."""
        if not self.has_room():
            return False
        if self.max_rows is not None and self.jobs and self.rows + job.rows > self.max_rows:
            return False
        self.jobs.append(job)
        return True

    def _oversized(self) -> bool:
        return self.max_rows is not None and self.rows > self.max_rows
