"""A scripted model family, for tests that need the model to say something exact (a function call, a malformed one):
the toy family (tone token2wav, its voices and connectors) with Qwen2.5's chat format (and so its function-calling
format), whose thinker replays scripts.

The thinker is the tiny checkpoint's, run by the real engine; only its vocabulary head is wrapped
(:class:`ScriptedHead`): while a script plays, every call of the head (a response's first token after its prefill,
then one per decode step) puts all the probability on the script's next token, and after the script's last token on
the end-of-turn token. Scripts are queued with :meth:`ScriptedFamily.play`, one per response, in order; with none
queued the checkpoint's own logits pass through. One conversation at a time (the head does not know rows apart).

Registered by the tests that use it (``pipeline.models.registered(SCRIPTED)``), under the name ``scripted``.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import torch

from pipeline.models.qwen2_5_omni.prompt import PromptRenderer
from toy_family.family import ToyCheckpoint, ToyFamily

SCRIPT_LOGIT = 100.0
"""The scripted token's logit (every other token's is 0): it wins greedy and sampled draws alike."""


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


class ScriptedFamily(ToyFamily):
    name = "scripted"
    default_instructions = "You are a scripted assistant."

    def __init__(self) -> None:
        self.head: ScriptedHead | None = None

    def max_context(self, ckpt: ToyCheckpoint) -> int:
        return 4096  # room for a tools block in the tiny tokenizer's many short tokens

    def renderer(self, ckpt: ToyCheckpoint) -> PromptRenderer:
        return PromptRenderer(ckpt.tokenizer, ckpt.special)

    def thinker_parts(self, ckpt: ToyCheckpoint, *, device, cuda_graphs: bool):
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


SCRIPTED = ScriptedFamily()
