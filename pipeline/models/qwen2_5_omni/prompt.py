"""Conversation rendering for Qwen2.5-Omni: the token layout of its chat template, built
message by message so the engine can prefill each message as it arrives.

Layout (what the checkpoint's chat template renders)::

    <|im_start|>{role}\\n{content}<|im_end|>\\n      per message
    <|im_start|>assistant\\n                         generation prompt

Audio content is ``<|audio_bos|>`` + one ``<|AUDIO|>`` placeholder per audio-encoder output token +
``<|audio_eos|>``; an image in a message is ``<|vision_bos|>`` + one ``<|IMAGE|>`` per vision-tower output token +
``<|vision_eos|>``, between the message's text parts. The role header and text content are tokenized as one
string, as the template does, so BPE merges across the newline match the reference exactly.
"""

from __future__ import annotations

from pipeline.models.common.chatml import ChatMLRenderer
from pipeline.models.common.transcription import TRANSCRIPTION_PROMPT

DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech."
)
"""The system prompt Qwen2.5-Omni's audio output was trained with (model card); speech output is
unreliable with any other, so it is the server's default instructions."""


__all__ = ["DEFAULT_SYSTEM_PROMPT", "TRANSCRIPTION_PROMPT", "ChatMLRenderer"]
