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


DEFAULT_REPLY_S = 8.0
"""The default workload's reply: seconds of audio (``--reply-s``), whatever the family's codec rate."""
TEXT_TOKENS_PER_SECOND = 30 / 8.0
"""Text tokens forced per second of reply audio unless ``--text-tokens`` says otherwise: 30 for an 8-second reply,
about what a spoken reply of that length says."""


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

    def describe(self) -> str:
        """The length in words, in seconds and in the family's codes: ``8.0 s of audio (100 codec tokens at 12.5 a
        second) and 30 text tokens``."""
        return (
            f"{self.audio_s:.1f} s of audio ({self.codec_tokens} codec tokens at {self.codes_per_second:g} a second) "
            f"and {self.text_tokens} text tokens"
        )


@dataclass(frozen=True)
class ReplyRequest:
    """A forced reply length as the command line asks for it: ``seconds`` of audio (``--reply-s``) or
    ``codec_tokens`` (``--codec-tokens``), exactly one of them; ``text_tokens`` (``--text-tokens``), None: in
    proportion to the audio (:data:`TEXT_TOKENS_PER_SECOND`). ``ValueError`` for a length that is not positive."""

    seconds: float | None = DEFAULT_REPLY_S
    codec_tokens: int | None = None
    text_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.codec_tokens is None):
            raise ValueError("a reply length is either seconds of audio (--reply-s) or codec tokens (--codec-tokens)")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"--reply-s must be > 0 seconds, got {self.seconds:g}")
        for flag, value in (("--codec-tokens", self.codec_tokens), ("--text-tokens", self.text_tokens)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")

    def resolve(self, codes_per_second: float) -> ReplyLength:
        """The length in a family's codes (``codes_per_second`` of them per second of audio): the seconds rounded to
        whole codes (at least one); the text tokens given, else :data:`TEXT_TOKENS_PER_SECOND` of the audio's
        seconds (at least one)."""
        if self.codec_tokens is not None:
            codes = self.codec_tokens
        else:
            assert self.seconds is not None  # one of the two (__post_init__)
            codes = max(1, round(self.seconds * codes_per_second))
        text = self.text_tokens
        if text is None:
            text = max(1, round(codes / codes_per_second * TEXT_TOKENS_PER_SECOND))
        return ReplyLength(text, codes, codes_per_second)

    def words(self) -> str:
        """The length as asked: ``8.0 s of audio and text in proportion``, ``400 codec tokens and 30 text tokens``."""
        audio = f"{self.seconds:.1f} s of audio" if self.seconds is not None else f"{self.codec_tokens} codec tokens"
        text = f"{self.text_tokens} text tokens" if self.text_tokens is not None else "text in proportion"
        return f"{audio} and {text}"

    def describe(self) -> str:
        """The length as asked, for a server whose model family (so codec rate) the bench does not know."""
        return f"{self.words()}, as asked (the server's model family, so its codec rate, is unknown to the bench)"


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
    samples), each answered with a reply of ``length`` (a :class:`ReplyRequest` when the served family is not known:
    a ``--url`` server's)."""

    length: ReplyLength | ReplyRequest
    turns: int

    def describe(self) -> str:
        return f"{_turns(self.turns)} per user, replies forced to {self.length.describe()}"

    def lighter_than(self, default: Workload) -> str | None:
        """What makes this workload lighter than ``default`` (whose length is a :class:`ReplyLength`: shorter replies,
        fewer turns), in words; ``None`` when nothing does. A length of unknown codes compares in seconds and text
        tokens, as far as it gives them."""
        mine, theirs = self.length, default.length
        assert isinstance(theirs, ReplyLength), "the default workload's length is in codes"
        lighter = []
        if isinstance(mine, ReplyRequest):
            shorter = (mine.seconds is not None and mine.seconds < theirs.audio_s) or (
                mine.text_tokens is not None and mine.text_tokens < theirs.text_tokens
            )
            if shorter:
                lighter.append(
                    f"replies of {mine.words()} instead of {theirs.audio_s:.1f} s and {theirs.text_tokens} text tokens"
                )
        elif mine.text_tokens < theirs.text_tokens or mine.codec_tokens < theirs.codec_tokens:
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
    """The default workload's reply length in ``family``'s codes: :data:`DEFAULT_REPLY_S` seconds of audio (the
    lengths ``family``'s :data:`FORCED_STAGE_CONFIGS` force, for a ``--url`` server started with them)."""
    return ReplyRequest(DEFAULT_REPLY_S).resolve(family_of(family).codes_per_second)


def reply_length(cfg: StageGraphConfig) -> ReplyLength:
    """The forced reply length of ``cfg``; :class:`BenchConfigError` when it does not force one (min < max),
    since the reference must do the same work."""
    th, ta = cfg.thinker, cfg.talker
    text_tokens, codec_tokens = th.max_tokens, ta.max_tokens
    if text_tokens is None or codec_tokens is None or th.min_tokens != text_tokens or ta.min_tokens != codec_tokens:
        raise BenchConfigError(
            "the bench needs forced reply lengths: set min_tokens = max_tokens for thinker and "
            "talker (pipeline/stage_configs/bench_forced.yaml does)"
        )
    return ReplyLength(text_tokens, codec_tokens, family_of(cfg.model_family).codes_per_second)


def served_model(url: str, *, timeout_s: float = 10.0) -> str | None:
    """The model a running server names in its ``/healthz`` (unauthenticated; ``model``: the checkpoint it was given,
    a folder or hub id, or a random architecture's label); None when the server does not answer with one."""
    import json
    import urllib.request

    from realtime.bench.throughput import server_url

    try:
        with urllib.request.urlopen(server_url(url, "/healthz"), timeout=timeout_s) as response:  # noqa: S310
            body = json.loads(response.read().decode("utf-8"))
    except (OSError, ValueError):  # unreachable, 503 (no engine serving), or not JSON
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


def served_family(model: str) -> str | None:
    """The family of a served model by name: the family whose ``config.json`` ``model_type`` a checkpoint folder or
    cached hub id of that name on this machine has (nothing downloaded); None when this machine cannot read it (a
    remote server's folder, a random architecture built in memory)."""
    from pipeline.errors import CheckpointError
    from pipeline.models import checkpoint_family

    try:
        return checkpoint_family(model)
    except CheckpointError:
        return None


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
