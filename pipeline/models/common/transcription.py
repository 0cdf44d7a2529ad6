"""How a Qwen-Omni thinker is asked to write down what a user said (input audio transcription: the server runs it in a
side conversation over the user's audio). Both families' thinkers were trained on the same instruction style."""

from __future__ import annotations

from pipeline.api import TranscriptionPrompt

TRANSCRIPTION_PROMPT = TranscriptionPrompt(
    instructions="You are a speech recognition model. You write down what people say, word for word.",
    request=(
        "Write down exactly what was said in this recording, in the language it was spoken in. "
        "Reply with the words only: no answer, no comment, no description of the sound."
    ),
    language_hint="The speaker uses the language with code '{language}'.",
    context_hint="Context that may help with names and terms: {prompt}",
)
"""Input transcription with a Qwen-Omni thinker: a system message saying it is a speech recognizer, the user's
audio, then the request to write it down."""
