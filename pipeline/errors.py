"""One exception hierarchy for the engine.

Every error the pipeline raises on purpose derives from :class:`PipelineError` and carries a
stable ``code`` (snake_case). The realtime layer maps these codes to protocol ``error`` events
in one place (``realtime.errors``); nothing else should need to inspect exception types.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class. ``code`` is a stable machine-readable identifier; ``param`` names the
    offending argument or config field when there is one."""

    code = "pipeline_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ConfigError(PipelineError):
    """The stage-graph YAML is malformed; ``param`` is the dotted path of the bad field."""

    code = "invalid_stage_config"


class CheckpointError(PipelineError):
    """Checkpoint files are missing or inconsistent with each other."""

    code = "invalid_checkpoint"


class InvalidInputError(PipelineError):
    """A request argument is invalid (bad audio, empty input, unknown item...)."""

    code = "invalid_input"


class UnknownVoiceError(InvalidInputError):
    code = "unknown_voice"


class EmptyInputError(InvalidInputError):
    code = "empty_input"


class InvalidAudioError(InvalidInputError):
    """Audio with the wrong dtype, shape, sample rate, or non-finite samples."""

    code = "invalid_audio"


class ContextLimitError(InvalidInputError):
    """The conversation would exceed the thinker's context window (or the configured limit)."""

    code = "context_length_exceeded"


class UnknownItemError(InvalidInputError):
    code = "item_not_found"


class ResponseActiveError(PipelineError):
    """A conversation can run one response at a time; mutating it meanwhile is refused."""

    code = "conversation_busy"


class EngineClosedError(PipelineError):
    code = "engine_closed"


class EngineFailure(PipelineError):
    """An unexpected exception inside a stage; the failing response ends with status failed."""

    code = "engine_failure"
