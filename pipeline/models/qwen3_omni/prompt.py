"""Conversation prompts for Qwen3-Omni: its chat layout is Qwen's ChatML (:mod:`pipeline.models.common.chatml`) with
Qwen3-Omni's own markers (``<|audio_start|>`` + audio placeholders + ``<|audio_end|>``; ``<|vision_start|>`` + image
placeholders + ``<|vision_end|>``), read from the checkpoint; function calling in Qwen's format
(:mod:`pipeline.models.common.hermes_tools`). The Instruct checkpoints' generation prompt is
``<|im_start|>assistant\\n`` with no thinking block, which is also what the talker's prompt layout assumes (its first
three assistant positions)."""

from __future__ import annotations

from pipeline.models.common.chatml import ChatMLRenderer
from pipeline.models.common.transcription import TRANSCRIPTION_PROMPT

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Speak naturally and briefly, as in a conversation: plain sentences, no "
    "lists, no markup, no descriptions of sounds or actions. Answer in the language the user speaks."
)
"""The server's default instructions for Qwen3-Omni: its speech output needs no fixed system prompt (unlike
Qwen2.5-Omni's), so this one only asks for replies that read well aloud."""

__all__ = ["DEFAULT_SYSTEM_PROMPT", "TRANSCRIPTION_PROMPT", "ChatMLRenderer"]
