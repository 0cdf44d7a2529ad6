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

from pipeline.api import TranscriptionPrompt
from pipeline.models.common.chatml import PromptRenderer

DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech."
)
"""The system prompt Qwen2.5-Omni's audio output was trained with (model card); speech output is
unreliable with any other, so it is the server's default instructions."""


TRANSCRIPTION_PROMPT = TranscriptionPrompt(
    instructions="You are a speech recognition model. You write down what people say, word for word.",
    request=(
        "Write down exactly what was said in this recording, in the language it was spoken in. "
        "Reply with the words only: no answer, no comment, no description of the sound."
    ),
    language_hint="The speaker uses the language with code '{language}'.",
    context_hint="Context that may help with names and terms: {prompt}",
)
"""Input transcription with Qwen2.5-Omni's thinker: a system message saying it is a speech recognizer, the user's
audio, then the request to write it down."""

__all__ = ["DEFAULT_SYSTEM_PROMPT", "TRANSCRIPTION_PROMPT", "PromptRenderer"]
