"""A queue of encodes that run together at the start of the next engine step: what
:mod:`pipeline.runners.audio_encodes` queues (:mod:`pipeline.runners.image_encodes` keeps its own queue of pictures
and uses :meth:`EncodeQueue.encode`, on the vision worker's thread).

Contract: a block's ``embeds`` is allocated empty on the device at once (:meth:`EncodeQueue.empty`) and queued with
its encoder input (:meth:`EncodeQueue.add`); the next :meth:`EncodeQueue.flush` fills every queued block by one call
of the encoder, in the order they were queued. If that call fails, each block is encoded alone, so only a faulty one
fails: it keeps the exception in its ``error``, and the response that would read it fails with it. Device work is
stream-ordered, so nothing waits for it on the host. The queue holds what the engine's commands added since the last
step: the engine flushes it at the start of every step, and a flush empties it whatever the encodes did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

__all__ = ["EncodeNames", "EncodeQueue"]


class _Block(Protocol):
    embeds: torch.Tensor
    error: Exception | None


Input = TypeVar("Input")
Block = TypeVar("Block", bound=_Block)


@dataclass(frozen=True)
class EncodeNames:
    """How the log and the errors name things: ``many`` the blocks (``"pictures"``), ``one`` a block with its
    article (``"a picture"``), ``unit`` a block in a shape mismatch (``"picture"``), ``encoder`` what encodes. The
    failures are logged to the ``log`` given to :class:`EncodeQueue` (the queuing module's logger)."""

    many: str
    one: str
    unit: str
    encoder: str


class EncodeQueue(Generic[Input, Block]):
    def __init__(
        self,
        encode_many: Callable[[list[Input]], list[Any]],
        names: EncodeNames,
        *,
        log: logging.Logger,
        width: int,
        dtype: torch.dtype,
        device: torch.device,
        fill: Callable[[Block, Any], None] | None = None,
    ) -> None:
        """``encode_many``: the encoder's outputs of the queued inputs, in order; ``fill(block, output)`` copies one
        output into its block (default: a tensor into ``block.embeds``, :meth:`copy_checked`)."""
        self._encode_many = encode_many
        self._fill_block = fill or (lambda block, out: self.copy_checked(block.embeds, out))
        self._names, self._log = names, log
        self._width, self._dtype, self._device = width, dtype, torch.device(device)
        self._queue: list[tuple[Input, Block]] = []

    @property
    def pending(self) -> int:
        return len(self._queue)

    def empty(self, tokens: int) -> torch.Tensor:
        """Unfilled ``embeds`` for a block of ``tokens`` tokens: (tokens, width) on the device."""
        return torch.empty(tokens, self._width, dtype=self._dtype, device=self._device)

    def add(self, item: Input, block: Block) -> Block:
        """Queue ``block`` to be filled with the encoding of ``item`` at the next :meth:`flush`; returns it."""
        self._queue.append((item, block))
        return block

    def flush(self) -> int:
        """Encode every queued block in one call (if that fails, each alone, so only a faulty one fails). Returns
        how many were encoded."""
        queued, self._queue = self._queue, []
        for block, exc in self.encode(queued):
            block.error = exc
        return len(queued)

    def encode(self, queued: list[tuple[Input, Block]]) -> list[tuple[Block, Exception]]:
        """Fill the blocks of ``queued`` ``(input, block)`` pairs by one call of the encoder (if that fails, each alone)
        and return the blocks that failed with their exceptions, setting nothing else on them: the caller records the
        errors on its own thread. Runs on any one thread at a time whose current stream may write the blocks
        (:meth:`flush` on the engine thread; the vision's :class:`~pipeline.runners.encode_worker.EncodeWorker`)."""
        if not queued:
            return []
        try:
            self._fill(queued, self._encode_many([item for item, _ in queued]))
            return []
        except Exception:  # noqa: BLE001 - find the faulty block by encoding one by one
            self._log.exception("batched encode of %d %s failed; encoding each alone", len(queued), self._names.many)
        failures = []
        for item, block in queued:
            try:
                self._fill([(item, block)], self._encode_many([item]))
            except Exception as exc:  # noqa: BLE001 - returned: its response fails with it
                self._log.exception("encoding %s failed", self._names.one)
                failures.append((block, exc))
        return failures

    def copy_checked(self, target: torch.Tensor, out: torch.Tensor) -> None:
        """Copy an encoder output into a block's tensor of the same shape; RuntimeError naming both shapes if not."""
        if out.shape != target.shape:
            want = tuple(target.shape)
            raise RuntimeError(f"{self._names.encoder} gave {tuple(out.shape)} for a {self._names.unit} of {want}")
        target.copy_(out)

    def _fill(self, queued: list[tuple[Input, Block]], outputs: list[Any]) -> None:
        for (_, block), out in zip(queued, outputs, strict=True):
            self._fill_block(block, out)
