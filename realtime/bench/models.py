"""Which model the bench serves (itself, without ``--url``) and hands to the reference, with forced reply
lengths.

``--model`` values: ``None`` / ``embedded:tiny`` (the embedded tiny random model), ``random:tiny`` or
``random:7b`` (that random Qwen2.5-Omni architecture built in memory on the stage device, nothing downloaded
or written: the 7B one is the full Qwen2.5-Omni-7B architecture, 10.69 B parameters, bf16 on a
GPU), ``random:qwen3-omni-tiny`` or ``random:qwen3-omni-30b-a3b`` (Qwen3-Omni's: the released 30B-A3B architecture,
35.3 B parameters), or a checkpoint folder / cached hub id (served by the family its config.json names).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config import StageGraphConfig, load_stage_config
from pipeline.hosting.loaders import CheckpointLoader, PretrainedCheckpoint, RandomCheckpoint
from pipeline.models import DEFAULT_FAMILY, family_of


class BenchConfigError(ValueError):
    """A model or stage config the bench cannot use (the message says why)."""


STAGE_CONFIGS = Path(__file__).resolve().parents[2] / "pipeline" / "stage_configs"
FORCED_STAGE_CONFIGS = {
    "qwen2_5_omni": STAGE_CONFIGS / "bench_forced.yaml",
    "qwen3_omni": STAGE_CONFIGS / "bench_forced_qwen3_omni.yaml",
}
"""Each family's bench stage graph: its packaged one with the default workload's reply lengths forced."""
FORCED_STAGE_CONFIG = FORCED_STAGE_CONFIGS[DEFAULT_FAMILY]
RANDOM_PREFIX = "random:"
RANDOM_FAMILY_PREFIXES = {"qwen3-omni-": "qwen3_omni"}
"""``random:<prefix><preset>``: a random architecture of that family (no prefix: the default family's)."""


@dataclass(frozen=True)
class ReplyLength:
    """Forced reply length: thinker tokens and talker codec tokens (``codes_per_second`` per second of audio: 50 for
    Qwen2.5-Omni's codes, 12.5 for Qwen3-Omni's frames)."""

    text_tokens: int
    codec_tokens: int
    codes_per_second: float = 50.0

    @property
    def audio_s(self) -> float:
        return self.codec_tokens / self.codes_per_second


def bench_family(model: str | None, stage_config: Path | None) -> str:
    """The model family a bench run serves: its stage config's, else the one ``--model`` names (a random architecture
    ``random:<family prefix><preset>``, or a checkpoint's config.json), else the default family."""
    if stage_config is not None:
        return load_stage_config(stage_config).model_family
    if model is None or model == "embedded:tiny":
        return DEFAULT_FAMILY
    if model.startswith(RANDOM_PREFIX):
        return _random_model(model)[0]
    from pipeline.models import checkpoint_family

    return checkpoint_family(model)


def _random_model(model: str) -> tuple[str, str]:
    """(family, preset) of ``random:...``."""
    name = model[len(RANDOM_PREFIX) :]
    for prefix, family in RANDOM_FAMILY_PREFIXES.items():
        if name.startswith(prefix):
            return family, name[len(prefix) :]
    return DEFAULT_FAMILY, name


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


def bench_stage_config(
    path: Path | None, *, device: str | None, length: ReplyLength | None, family: str = DEFAULT_FAMILY
) -> StageGraphConfig:
    """The stage graph at ``path`` (default: ``family``'s :data:`FORCED_STAGE_CONFIGS`), every stage on ``device``
    when given, reply lengths forced to ``length`` when given (min = max tokens). A ``device`` with a stage config
    that places its stages on different devices is refused (:class:`BenchConfigError`): it would undo the placement
    being measured."""
    path = path or FORCED_STAGE_CONFIGS[family]
    if device is not None:
        placement = load_stage_config(path).devices
        if len(placement) > 1:
            raise BenchConfigError(
                f"--device {device} would put every stage on one device, but the stage config places them on "
                f"{', '.join(placement)}: leave --device out to measure that placement"
            )
    placed: dict[str, str | int] = {} if device is None else {"device": device}
    thinker, talker = dict(placed), dict(placed)
    if length is not None:
        thinker.update(min_tokens=length.text_tokens, max_tokens=length.text_tokens)
        talker.update(min_tokens=length.codec_tokens, max_tokens=length.codec_tokens)
    # merged in before validation, so that ``auto`` values resolve against ``device``
    return load_stage_config(path, overrides={"stages": {"thinker": thinker, "talker": talker, "token2wav": placed}})


def _turns(count: int) -> str:
    return f"{count} turn" + ("" if count == 1 else "s")


def default_reply_length(family: str = DEFAULT_FAMILY) -> ReplyLength:
    """The reply length of ``family``'s :data:`FORCED_STAGE_CONFIGS`: the bench's default workload's."""
    return reply_length(load_stage_config(FORCED_STAGE_CONFIGS[family]))


def reply_length(cfg: StageGraphConfig) -> ReplyLength:
    """The forced reply length of ``cfg``; :class:`BenchConfigError` when it does not force one (min < max),
    since the reference must do the same work."""
    th, ta = cfg.thinker, cfg.talker
    text_tokens, codec_tokens = th.max_tokens, ta.max_tokens
    if text_tokens is None or codec_tokens is None or th.min_tokens != text_tokens or ta.min_tokens != codec_tokens:
        raise BenchConfigError(
            "the bench needs forced reply lengths: set min_tokens = max_tokens for thinker and "
            "talker (pipeline/stage_configs/bench_forced.yaml does, or pass --text-tokens and "
            "--codec-tokens)"
        )
    return ReplyLength(text_tokens, codec_tokens, family_of(cfg.model_family).codes_per_second)


def model_loader(model: str | None, *, cache_dir: Path | None = None, family: str = DEFAULT_FAMILY) -> CheckpointLoader:
    """The picklable recipe of ``model`` (:mod:`pipeline.hosting.loaders`) of model family ``family`` (the stage
    config's):
    an engine whose core runs in a child process hands it to the child, which builds or loads the weights itself (a
    random architecture on the thinker's device and dtype; token2wav float32)."""
    if model is not None and model.startswith(RANDOM_PREFIX):
        named, preset = _random_model(model)
        models = family_of(named)
        if named != family or preset not in models.random_presets:
            raise BenchConfigError(
                f"--model {model}: unknown random architecture of the stage config's family {family} (one of: "
                f"{', '.join(_random_names(family))})"
            )
        return RandomCheckpoint(models.random_spec(preset))
    from pipeline.embedded import resolve_model

    return PretrainedCheckpoint(resolve_model(model, cache_dir))


def _random_names(family: str) -> list[str]:
    prefix = next((p for p, f in RANDOM_FAMILY_PREFIXES.items() if f == family), "")
    return [RANDOM_PREFIX + prefix + p for p in sorted(family_of(family).random_presets)]


def model_label(model: str | None, cfg: StageGraphConfig, *, source: str, random_weights: bool) -> str:
    """A one-line description of what ``--model`` loaded (``source`` and ``random_weights`` as the engine or
    the checkpoint reports them), for reports."""
    dtype = cfg.thinker.dtype
    if model is not None and model.startswith(RANDOM_PREFIX):
        family, preset = _random_model(model)
        return f"{family_of(family).display_name} {preset} architecture, random weights built in memory ({dtype})"
    if model in (None, "embedded:tiny"):
        return f"embedded tiny model (random weights, {dtype})"
    return f"{source} ({'random weights, ' if random_weights else ''}{dtype})"
