"""Voice names a session accepts: the checkpoint's speakers, and aliases that map other names onto them.

Clients written for the OpenAI Realtime API ask for OpenAI's voices (``alloy``, ``marin``…) by default. The server
has a table of aliases (``ServerConfig.voice_aliases``, ``serve --voice-alias NAME=SPEAKER``); the default maps each
of OpenAI's built-in voices to the Qwen2.5-Omni speaker of the same usual gender (:data:`DEFAULT_VOICE_ALIASES`).

Resolution (:meth:`VoiceTable.resolve`), case-insensitive: a checkpoint speaker first, then an alias. The session
keeps and reports the name the client asked for (``marin`` stays ``marin`` in ``session.updated`` and
``response.created``; a speaker is reported in the checkpoint's spelling); the engine is asked for the speaker. An
alias whose speaker the checkpoint lacks is left out of the table (:func:`usable_aliases`), so that name, like any
name in neither, is an ``unknown_voice`` error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")
"""The built-in voices of the OpenAI Realtime API (the ``openai`` SDK's ``Voice`` literal)."""

DEFAULT_VOICE_ALIASES: tuple[tuple[str, str], ...] = (
    ("alloy", "Chelsie"),
    ("ash", "Ethan"),
    ("ballad", "Ethan"),
    ("coral", "Chelsie"),
    ("echo", "Ethan"),
    ("sage", "Chelsie"),
    ("shimmer", "Chelsie"),
    ("verse", "Ethan"),
    ("marin", "Chelsie"),
    ("cedar", "Ethan"),
)
"""OpenAI's voices → Qwen2.5-Omni's speakers by the voice's usual gender: female-sounding ones to ``Chelsie``,
male-sounding ones to ``Ethan``."""


def parse_voice_alias(text: str) -> tuple[str, str]:
    """``NAME=SPEAKER`` → ``(NAME, SPEAKER)``; ``ValueError`` naming the problem."""
    name, sep, speaker = text.partition("=")
    name, speaker = name.strip(), speaker.strip()
    if not sep or not name or not speaker:
        raise ValueError(f"a voice alias is NAME=SPEAKER (for example marin=Chelsie), got {text!r}")
    return name, speaker


def check_voice_aliases(aliases: tuple[tuple[str, str], ...]) -> None:
    """``ValueError`` unless ``aliases`` is a tuple of ``(name, speaker)`` pairs of non-empty strings, each name
    (case-insensitively) once."""
    seen: set[str] = set()
    for pair in aliases:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) and s.strip() for s in pair)):
            raise ValueError(f"voice_aliases must hold (name, speaker) pairs of non-empty strings, got {pair!r}")
        key = pair[0].lower()
        if key in seen:
            raise ValueError(f"voice_aliases names {pair[0]!r} twice")
        seen.add(key)


def with_aliases(base: tuple[tuple[str, str], ...], extra: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """``base`` with ``extra``'s pairs added; an extra pair replaces the base pair of the same name."""
    table = {name.lower(): (name, speaker) for name, speaker in base}
    for name, speaker in extra:
        table[name.lower()] = (name, speaker)
    return tuple(table.values())


def usable_aliases(
    aliases: tuple[tuple[str, str], ...], speakers: tuple[str, ...]
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """``(usable, unusable)``: the aliases whose speaker the checkpoint has (matched case-insensitively, rewritten
    in the checkpoint's spelling), and the others."""
    by_key = {speaker.lower(): speaker for speaker in speakers}
    usable: list[tuple[str, str]] = []
    unusable: list[tuple[str, str]] = []
    for name, speaker in aliases:
        known = by_key.get(speaker.lower())
        (usable if known else unusable).append((name, known or speaker))
    return tuple(usable), tuple(unusable)


@dataclass(frozen=True)
class VoiceTable:
    """The voices one session accepts: ``speakers`` (the checkpoint's) and ``aliases`` onto them."""

    speakers: tuple[str, ...]
    aliases: tuple[tuple[str, str], ...] = ()

    def resolve(self, name: str) -> tuple[str, str] | None:
        """``(reported name, speaker)`` for ``name``, or None when it is neither a speaker nor an alias."""
        key = name.lower()
        for speaker in self.speakers:
            if speaker.lower() == key:
                return speaker, speaker
        for alias, speaker in self.aliases:
            if alias.lower() == key:
                return name, speaker
        return None

    def names(self) -> str:
        """The accepted names, for an error message."""
        extra = f"; or an alias: {', '.join(a for a, _ in self.aliases)}" if self.aliases else ""
        return ", ".join(self.speakers) + extra
