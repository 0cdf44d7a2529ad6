"""Scripted model families, for tests that need the model to say something exact (a function call, a malformed one):
a real family whose thinker replays scripts, with the ChatML chat format (and so Hermes-style function calls).

- :data:`SCRIPTED` (``scripted``): the toy family (the tiny Qwen2.5-Omni checkpoint's thinker and talker, a tone
  token2wav, voices ``low`` and ``high``).
- :data:`SCRIPTED_QWEN3` (``scripted_qwen3``): the Qwen3-Omni family as it is (its frame talker, its code2wav, its
  voices), on a Qwen3-Omni checkpoint.

The thinker is the checkpoint's, run by the real engine; only its vocabulary head is wrapped
(:class:`ScriptedHead`): while a script plays, every call of the head (a response's first token after its prefill,
then one per decode step) puts all the probability on the script's next token, and after the script's last token on
the end-of-turn token. Scripts are queued with :meth:`ScriptedThinker.play`, one per response, in order; with none
queued the checkpoint's own logits pass through. One conversation at a time (the head does not know rows apart).

Registered by the tests that use them (``pipeline.models.registered(SCRIPTED)``), under their names.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import torch

from pipeline.models.common.chatml import ChatMLRenderer
from pipeline.models.qwen3_omni.family import Qwen3OmniFamily
from toy_family.family import ToyFamily

SCRIPT_LOGIT = 100.0
"""The scripted token's logit (every other token's is 0): it wins greedy and sampled draws alike."""
MIN_CONTEXT = 4096
"""The least context a scripted family offers: room for a tools block in a tiny tokenizer's many short tokens."""


class ScriptedHead(torch.nn.Module):
    """The thinker's vocabulary head, replaying queued token scripts (see the module docstring)."""

    def __init__(self, head: torch.nn.Module, end_of_turn: int) -> None:
        super().__init__()
        self.head = head
        self.out_features = head.out_features
        self.end_of_turn = end_of_turn
        self.scripts: deque[list[int]] = deque()
        self.playing: deque[int] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        if self.playing is None and self.scripts:
            self.playing = deque([*self.scripts.popleft(), self.end_of_turn])
        if self.playing is None:
            return logits
        token = self.playing.popleft()
        if not self.playing:
            self.playing = None
        scripted = torch.zeros_like(logits)
        scripted[..., token] = SCRIPT_LOGIT
        return scripted


class ScriptedThinker:
    """What makes a family scripted (mixed in ahead of the family's class): the ChatML renderer, at least
    :data:`MIN_CONTEXT` of context, and the thinker's head replaying scripts."""

    default_instructions = "You are a scripted assistant."

    def __init__(self) -> None:
        self.head: ScriptedHead | None = None

    def max_context(self, ckpt) -> int:
        return max(super().max_context(ckpt), MIN_CONTEXT)

    def renderer(self, ckpt) -> ChatMLRenderer:
        return ChatMLRenderer(ckpt.tokenizer, ckpt.special)

    def thinker_parts(self, ckpt, *, device, cuda_graphs: bool):
        parts = super().thinker_parts(ckpt, device=device, cuda_graphs=cuda_graphs)
        self.head = ScriptedHead(parts.lm_head, ckpt.special.im_end)
        return dataclasses.replace(parts, lm_head=self.head)

    def play(self, *scripts: list[int]) -> None:
        """Queue one token script per coming response, in order."""
        assert self.head is not None, "the engine has not built the thinker yet"
        self.head.scripts.extend(list(s) for s in scripts)

    def reset(self) -> None:
        """Forget queued scripts and any script left half played (a response cancelled midway)."""
        if self.head is not None:
            self.head.scripts.clear()
            self.head.playing = None


class ScriptedFamily(ScriptedThinker, ToyFamily):
    name = "scripted"


class ScriptedQwen3Family(ScriptedThinker, Qwen3OmniFamily):
    name = "scripted_qwen3"


SCRIPTED = ScriptedFamily()
SCRIPTED_QWEN3 = ScriptedQwen3Family()
