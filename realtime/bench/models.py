"""Which model the bench serves (itself, without ``--url``) and hands to the reference, with forced reply
lengths.

``--model`` values: ``None`` / ``embedded:tiny`` (the embedded tiny random model), ``random:tiny`` or
``random:7b`` (that random architecture built in memory on the stage device, nothing downloaded
or written: the 7B one is the full Qwen2.5-Omni-7B architecture, 10.69 B parameters, bf16 on a
GPU), or a checkpoint folder / cached hub id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config import StageGraphConfig, load_stage_config
from pipeline.loaders import CheckpointLoader, PretrainedCheckpoint, RandomCheckpoint
from pipeline.models import DEFAULT_FAMILY, family_of


class BenchConfigError(ValueError):
    """A model or stage config the bench cannot use (the message says why)."""


FORCED_STAGE_CONFIG = Path(__file__).resolve().parents[2] / "pipeline" / "stage_configs" / "bench_forced.yaml"
RANDOM_PREFIX = "random:"


@dataclass(frozen=True)
class ReplyLength:
    """Forced reply length: thinker tokens and talker codec tokens (50 per second of audio)."""

    text_tokens: int
    codec_tokens: int

    @property
    def audio_s(self) -> float:
        return self.codec_tokens / 50.0


@dataclass(frozen=True)
class Workload:
    """What each simulated user does: ``turns`` turns (at least: low concurrency levels run more, for enough
    samples), each answered with a reply of ``length``."""

    length: ReplyLength
    turns: int

    def describe(self) -> str:
        return (
            f"{_turns(self.turns)} per user, replies forced to {self.length.text_tokens} text + "
            f"{self.length.codec_tokens} codec tokens ({self.length.audio_s:.1f} s of audio)"
        )

    def lighter_than(self, default: Workload) -> str | None:
        """What makes this workload lighter than ``default`` (shorter replies, fewer turns), in words;
        ``None`` when nothing does."""
        mine, theirs = self.length, default.length
        lighter = []
        if mine.text_tokens < theirs.text_tokens or mine.codec_tokens < theirs.codec_tokens:
            lighter.append(
                f"replies of {mine.text_tokens} text + {mine.codec_tokens} codec tokens "
                f"({mine.audio_s:.1f} s) instead of {theirs.text_tokens} + {theirs.codec_tokens} "
                f"({theirs.audio_s:.1f} s)"
            )
        if self.turns < default.turns:
            lighter.append(f"{_turns(self.turns)} per user instead of {default.turns}")
        return "; ".join(lighter) or None


def bench_stage_config(path: Path | None, *, device: str | None, length: ReplyLength | None) -> StageGraphConfig:
    """The stage graph at ``path`` (default :data:`FORCED_STAGE_CONFIG`), every stage on ``device``
    when given, reply lengths forced to ``length`` when given (min = max tokens). A ``device`` with a stage config
    that places its stages on different devices is refused (:class:`BenchConfigError`): it would undo the placement
    being measured."""
    if device is not None:
        placement = load_stage_config(path or FORCED_STAGE_CONFIG).devices
        if len(placement) > 1:
            raise BenchConfigError(
                f"--device {device} would put every stage on one device, but the stage config places them on "
                f"{', '.join(placement)}: leave --device out to measure that placement"
            )
    placed = {} if device is None else {"device": device}
    thinker, talker = dict(placed), dict(placed)
    if length is not None:
        thinker.update(min_tokens=length.text_tokens, max_tokens=length.text_tokens)
        talker.update(min_tokens=length.codec_tokens, max_tokens=length.codec_tokens)
    # merged in before validation, so that ``auto`` values resolve against ``device``
    return load_stage_config(
        path or FORCED_STAGE_CONFIG, overrides={"stages": {"thinker": thinker, "talker": talker, "token2wav": placed}}
    )


def _turns(count: int) -> str:
    return f"{count} turn" + ("" if count == 1 else "s")


def default_reply_length() -> ReplyLength:
    """The reply length of :data:`FORCED_STAGE_CONFIG`: the bench's default workload's."""
    return reply_length(load_stage_config(FORCED_STAGE_CONFIG))


def reply_length(cfg: StageGraphConfig) -> ReplyLength:
    """The forced reply length of ``cfg``; :class:`BenchConfigError` when it does not force one (min < max),
    since the reference must do the same work."""
    th, ta = cfg.thinker, cfg.talker
    if any(stage.min_tokens is None or stage.min_tokens != stage.max_tokens for stage in (th, ta)):
        raise BenchConfigError(
            "the bench needs forced reply lengths: set min_tokens = max_tokens for thinker and "
            "talker (pipeline/stage_configs/bench_forced.yaml does, or pass --text-tokens and "
            "--codec-tokens)"
        )
    return ReplyLength(th.max_tokens, ta.max_tokens)


def model_loader(model: str | None, *, cache_dir: Path | None = None, family: str = DEFAULT_FAMILY) -> CheckpointLoader:
    """The picklable recipe of ``model`` (:mod:`pipeline.loaders`) of model family ``family`` (the stage config's):
    an engine whose core runs in a child process hands it to the child, which builds or loads the weights itself (a
    random architecture on the thinker's device and dtype; token2wav float32)."""
    if model is not None and model.startswith(RANDOM_PREFIX):
        models = family_of(family)
        preset = model[len(RANDOM_PREFIX) :]
        if preset not in models.random_presets:
            raise BenchConfigError(
                f"--model {model}: unknown random architecture (one of: "
                f"{', '.join(RANDOM_PREFIX + p for p in sorted(models.random_presets))})"
            )
        return RandomCheckpoint(models.random_spec(preset))
    from pipeline.embedded import resolve_model

    return PretrainedCheckpoint(resolve_model(model, cache_dir))


def load_model(model: str | None, cfg: StageGraphConfig, *, cache_dir: Path | None = None):
    """The checkpoint of ``model`` (of ``cfg``'s model family), loaded in this process and placed as ``cfg``
    says."""
    return model_loader(model, cache_dir=cache_dir, family=cfg.model_family).load(cfg)


def model_label(model: str | None, cfg: StageGraphConfig, *, source: str, random_weights: bool) -> str:
    """A one-line description of what ``--model`` loaded (``source`` and ``random_weights`` as the engine or
    the checkpoint reports them), for reports."""
    dtype = cfg.thinker.dtype
    if model is not None and model.startswith(RANDOM_PREFIX):
        return f"Qwen2.5-Omni {model[len(RANDOM_PREFIX) :]} architecture, random weights built in memory ({dtype})"
    if model in (None, "embedded:tiny"):
        return f"embedded tiny model (random weights, {dtype})"
    return f"{source} ({'random weights, ' if random_weights else ''}{dtype})"
