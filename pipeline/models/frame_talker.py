"""What the engine needs from a family whose talker speaks in *frames*: each talker step samples codebook 0 of one
frame, and a residual predictor fills the frame's other codebooks before the next step (Qwen3-Omni: 16 codebooks per
80 ms frame). The engine's frame talker runner (:mod:`pipeline.runners.frame_talker`) drives these parts; a family
provides them with :meth:`ModelFamily.frame_talker_parts <pipeline.models.family.ModelFamily>`.

Streaming contract (what a family's parts must make equal to its reference):
- The talker's prompt reads only some of the conversation's positions (:meth:`FrameTalkerParts.prompt_positions`; the
  conversation's cached keys in, the indices it reads out, in order), each turned into a talker input by
  :meth:`FrameTalkerParts.prompt_inputs` from the vector the thinker stage stored for it.
- A reply's talker prefill is those prompt positions (the ones not already in the talker's cache), then
  :meth:`FrameTalkerParts.reply_start` (the assistant's opening, the voice, the first reply vector); its last
  position's logits give codebook 0 of frame 0.
- Each later step's input is :meth:`FrameTalkerParts.step_inputs` of the previous frame and the next text vector
  (reply vectors from the second on, then the text-end vector once, then the text-pad vector).
- After codebook 0 of a frame is sampled, the residual predictor (:class:`ResidualPredictor`, a small decoder run
  afresh for every frame) fills the rest of the frame from the talker's hidden state of that step: its opening
  (:meth:`ResidualPredictor.opening`) at positions ``0 .. opening_len - 1``, whose last logits give codebook 1; then
  codebook ``k``'s code, embedded (:meth:`ResidualPredictor.embed`), at position ``opening_len + k - 2`` gives codebook
  ``k + 1`` (:meth:`ResidualPredictor.logits`), up to the last codebook. The engine runs it over a KV pool of its own
  with fixed shapes, so a whole frame (talker step, codebook 0, residual codebooks) is one capturable function.
Positions: the talker's sequence is its own (the prompt positions it reads, then the reply's opening and frames);
its rope positions follow the family's :class:`~pipeline.models.positions.PositionScheme` over that sequence, the
thinker's explicit-position spans (pictures, video) of the positions it reads placed at their talker indices. Without
pictures or video every axis equals the talker's cache index.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class FrameTalkerParts(Protocol):
    """A family's frame talker on its device: the decoder body the engine's pooled decoder runs, and the glue.
    :attr:`head`, :meth:`step_inputs` and :attr:`residual` run inside the engine's frame step, which a CUDA graph
    captures: device work only, no host synchronisation."""

    body: Any
    """The talker's decoder stack, HF decoder-shaped (``layers``, ``norm``, ``rotary_emb``, ``config``)."""
    head: Any
    """Talker hidden state (B, Ht) -> codebook-0 logits (B, V)."""
    groups: int
    """Codes per frame (codebook 0 included)."""
    thinker_hidden_layer: int | None
    """Which thinker hidden state the stored prompt vectors read at multimodal positions (HF ``hidden_states`` index;
    None: the last, after the final norm)."""
    residual: ResidualPredictor
    """What fills codebooks 1.. of each frame."""
    text_width: int
    """Width of the text vectors :meth:`step_inputs` takes (the thinker's hidden size)."""
    text_end_ids: tuple[int, int]
    """Thinker-vocabulary ids of the text-end and text-pad inputs, in that order (embedded by the thinker)."""

    def prompt_positions(self, keys: Sequence[Hashable]) -> list[int]:
        """Indices of the positions of a rendered conversation (its cache keys: an ``int`` token id for text, a tuple
        for an audio, image or video position) that the talker's prompt reads, in order."""
        ...

    def prompt_inputs(self, vectors: torch.Tensor, keys: Sequence[Hashable]) -> torch.Tensor:
        """Talker inputs (T, Ht) of prompt positions: the vectors (T, H) the thinker stage stored for them and their
        keys."""
        ...

    def reply_start(self, first: torch.Tensor, voice: str) -> torch.Tensor:
        """The talker inputs (S, Ht) that follow the prompt for a reply in ``voice``: the assistant's opening and the
        first reply vector ``first`` (H,)."""
        ...

    def step_inputs(self, frames: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """Talker inputs (B, Ht) of a step: the previous frames (B, groups) int64 and the text vectors (B, H)."""
        ...


@runtime_checkable
class ResidualPredictor(Protocol):
    """A frame's residual codebooks as a small decoder run afresh for every frame (Qwen3-Omni: its code predictor, the
    MTP module). Every method is device work on the talker's device with no host synchronisation (the engine captures
    it in a CUDA graph); ``k`` counts codebooks (1 .. groups - 1)."""

    body: Any
    """The predictor's decoder stack, HF decoder-shaped (``layers``, ``norm``, ``rotary_emb``, ``config``); 1-D rope
    positions equal to the cache index."""
    opening_len: int
    """Positions of :meth:`opening`."""
    vocab: int
    """Codes of one residual codebook (the width of :meth:`logits`)."""

    def opening(self, hidden: torch.Tensor, code0: torch.Tensor) -> torch.Tensor:
        """Predictor inputs (B, ``opening_len``, Hp) of a frame from the talker's hidden states (B, Ht) of the step that
        sampled codebook 0 ``code0`` (B,) int64."""
        ...

    def embed(self, codes: torch.Tensor, k: int) -> torch.Tensor:
        """Predictor inputs (B, Hp) of codebook ``k``'s codes (B,) int64 (k = 1 .. groups - 2)."""
        ...

    def logits(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Codebook ``k``'s logits (B, ``vocab``) from the predictor's hidden states (B, Hp) (k = 1 .. groups - 1)."""
        ...
