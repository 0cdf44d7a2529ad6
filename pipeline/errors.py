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

    def __reduce__(self):
        # Errors cross the pipe of an engine running in a child process. Pickle rebuilds them through the
        # base signature (message, keyword-only param), then restores any other attribute a subclass set,
        # so the receiver gets the same class, code, message and param whatever a subclass's __init__ takes.
        return _rebuild_pipeline_error, (type(self), self.message, self.param, dict(self.__dict__))


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


class InvalidImageError(InvalidInputError):
    """A picture that is not uint8 RGB ``(H, W, 3)``, is empty, or is larger than the engine takes."""

    code = "invalid_image"


class UnsupportedInputError(InvalidInputError):
    """Input the checkpoint cannot take (images or video on a model without a vision tower), or output it cannot make
    (audio from a model without a talker: :func:`no_audio_output`)."""

    code = "unsupported_input"


def no_audio_output() -> UnsupportedInputError:
    """The error of a spoken response asked of an engine whose checkpoint has no talker (it answers in text only)."""
    return UnsupportedInputError(
        "this model has no audio output (its checkpoint has no talker): it answers in text only; "
        "ask for the text modality",
        param="modalities",
    )


class ContextLimitError(InvalidInputError):
    """The conversation would exceed the thinker's context window (or the configured limit)."""

    code = "context_length_exceeded"


class UnknownItemError(InvalidInputError):
    code = "item_not_found"


class ResponseActiveError(PipelineError):
    """A conversation can run one response at a time; mutating it meanwhile is refused."""

    code = "conversation_busy"


class FunctionCallError(PipelineError):
    """The model wrote a function call that does not hold up: not ``{"name": <a tool of the response>, "arguments":
    <JSON object>}`` between the family's call markers, or never closed. The response fails with it; the engine's
    caches stay valid (the model wrote it, nothing broke)."""

    code = "invalid_function_call"


class EngineClosedError(PipelineError):
    code = "engine_closed"


class EngineDeadError(EngineClosedError):
    """The engine's child process died (killed, crashed, CUDA error): every pending call and live response
    failed with this error, and so does every later call. The engine must be restarted."""

    code = "engine_dead"


class EngineFailure(PipelineError):
    """An unexpected exception inside a stage; the failing response ends with status failed."""

    code = "engine_failure"


class EngineProcessError(EngineFailure):
    """An unexpected (non-:class:`PipelineError`) exception raised by a command in the engine's child process,
    carried back by type name and message (its traceback is in the log, forwarded from the child)."""

    def __init__(self, message: str, *, param: str | None = None, remote_type: str = "Exception") -> None:
        super().__init__(message, param=param)
        self.remote_type = remote_type


def _rebuild_pipeline_error(cls: type[PipelineError], message: str, param: str | None, state: dict) -> PipelineError:
    exc = cls.__new__(cls)
    PipelineError.__init__(exc, message, param=param)
    exc.__dict__.update(state)
    return exc
