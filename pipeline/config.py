"""The stage graph, loaded from YAML into typed, validated config objects.

One class per stage (:class:`ThinkerConfig`, :class:`TalkerConfig`, :class:`Token2WavConfig`), each with only its
own settings, plus :class:`EngineConfig`, gathered in :class:`StageGraphConfig`. Every field's code default is the
packaged model's setting (``stage_configs/qwen2_5_omni.yaml`` may repeat a default to document it, never change
it). The YAML may say ``auto`` (or ``on`` / ``off``, also as YAML 1.1's bare booleans) where a setting depends on the
device; a config object resolves these once, when it is made, so its fields hold concrete values (``device="cuda"``,
``overlap=True``). A YAML file may start from another with ``extends`` (see :func:`load_stage_config`).

Errors are :class:`pipeline.errors.ConfigError` whose ``param`` is the dotted path of the bad field
(``stages.talker.sampling.top_p``). Connectors are looked up by name in the model family (:mod:`pipeline.models`);
the YAML never names import paths. The token2wav section also holds the family's own keys (its synthesizer's
settings), which the family parses (:meth:`pipeline.models.family.ModelFamily.token2wav_config`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

import yaml

from pipeline.errors import ConfigError
from pipeline.models import family_of
from pipeline.models.common.settings import AUTO, DTYPES, check_bool, check_choice, reject_unknown, switch

PACKAGED_STAGE_CONFIGS = {
    "qwen2_5_omni": Path(__file__).parent / "stage_configs" / "qwen2_5_omni.yaml",
    "qwen3_omni": Path(__file__).parent / "stage_configs" / "qwen3_omni.yaml",
}
"""Each model family's packaged stage graph (what a checkpoint of that family is served with by default)."""
DEFAULT_STAGE_CONFIG = PACKAGED_STAGE_CONFIGS["qwen2_5_omni"]
STAGE_ORDER = ("thinker", "talker", "token2wav")
"""Stage names in stream order; each stage's ``input`` must be the one before it."""
STAGE_INPUTS = {"thinker": "request", "talker": "thinker", "token2wav": "talker"}
SLOW_STEP_MS_CUDA = 250.0
SLOW_STEP_MS_CPU = 1000.0
KV_RESERVE_GIB = 4.0
"""``engine.kv_reserve_gib``'s default (docs/engine.md, "How many conversations fit", says what it was sized on)."""
KV_AUTO_MAX_SLOTS = 64
"""``engine.kv_auto_max_slots``'s default."""
CONTEXT_POLICIES = ("drop_oldest", "error")
AUDIO_FLOORS = ("streaming", "exact")
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")
"""What a stage's ``device`` may say."""
MAX_EXTENDS_DEPTH = 8
"""How many files a chain of ``extends`` may hold, the first included (a longer chain is refused as a likely cycle)."""


class UnparsedSettings(dict):
    """A family's keys of a stage config section as the YAML gave them, until the :class:`StageGraphConfig` has the
    family parse them."""


@dataclass(frozen=True)
class SamplingConfig:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def validate(self, path: str) -> None:
        if self.temperature <= 0:
            raise ConfigError(f"{path}.temperature must be > 0", param=f"{path}.temperature")
        if self.top_k < 0:
            raise ConfigError(f"{path}.top_k must be >= 0", param=f"{path}.top_k")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"{path}.top_p must be in (0, 1]", param=f"{path}.top_p")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"{path}.repetition_penalty must be > 0", param=f"{path}.repetition_penalty")


THINKER_SAMPLING = SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
"""Qwen2.5's chat defaults."""
TALKER_SAMPLING = SamplingConfig(do_sample=True, temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05)
"""The reference sampling of the official release."""
RESIDUAL_SAMPLING = SamplingConfig(do_sample=True, temperature=1.0, top_k=50, top_p=0.8)
"""How a frame talker's residual codebooks are sampled: the Qwen3-Omni reference's code predictor settings."""


def _kind(kind: str, default: Any = None, *, factory=None, choices: tuple = ()) -> Any:
    """A field with how its value is checked (``kind``) in its metadata: ``positive`` (an integer > 0, or None),
    ``at_least_0`` (an integer >= 0), ``slots`` (a positive integer, or ``auto``, kept as it is: resolved at load),
    ``seconds`` (a number >= 0, or None), ``fraction`` (a number in (0, 1]), ``bool``, ``str``, ``choice`` (one of
    ``choices``), ``device`` (auto, cpu, cuda or cuda:N), ``switch`` (auto / on / off or a boolean, resolved by the
    class), ``sampling``, ``fixed`` (must equal the default), ``family`` (the model family's own keys, parsed by the
    :class:`StageGraphConfig`)."""
    meta = {"kind": kind, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class StageConfig:
    """What every stage has: where it runs. ``device`` and ``dtype`` may be given as ``auto`` and hold concrete
    values once the config is made."""

    STAGE: ClassVar[str] = ""

    input: str = _kind("fixed", "")
    """The stage it reads (stages stream thinker -> talker -> token2wav)."""
    device: str = _kind("device", AUTO)
    """``cpu``, ``cuda`` or ``cuda:N``; ``auto`` = ``cuda`` when available, else ``cpu``. Stages may be on different
    GPUs of one host (docs/server.md, "Stage placement"); :func:`check_devices` says whether this host has them."""
    dtype: str = _kind("choice", AUTO, choices=(AUTO, *DTYPES))
    """The weights' precision; ``auto`` = bfloat16 on CUDA, float32 on the CPU (where half precision is slower)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            self._check(f)
        self._resolve()

    @property
    def path(self) -> str:
        return f"stages.{self.STAGE}"

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_device(self):
        """``device`` as a ``torch.device``."""
        import torch

        return torch.device(self.device)

    @property
    def torch_dtype(self):
        """``dtype`` as a ``torch.dtype``."""
        import torch

        return getattr(torch, self.dtype)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check(self, f) -> None:
        value, kind, where = getattr(self, f.name), f.metadata.get("kind"), f"{self.path}.{f.name}"
        if kind == "fixed" and value != f.default:
            raise ConfigError(
                f"{where} must be {f.default!r} (stages stream thinker -> talker -> token2wav)", param=where
            )
        elif kind == "positive" and value is not None and (not _is_int(value) or value <= 0):
            raise ConfigError(f"{where} must be a positive integer", param=where)
        elif kind == "slots" and value != AUTO and (not _is_int(value) or value <= 0):
            raise ConfigError(f"{where} must be a positive integer or auto, got {value!r}", param=where)
        elif kind == "at_least_0" and (not _is_int(value) or value < 0):
            raise ConfigError(f"{where} must be an integer >= 0", param=where)
        elif kind == "seconds" and value is not None and (not _is_number(value) or value < 0):
            raise ConfigError(f"{where} must be a number >= 0 (seconds) or null, got {value!r}", param=where)
        elif kind == "fraction" and (not _is_number(value) or not 0 < value <= 1):
            raise ConfigError(f"{where} must be a number in (0, 1], got {value!r}", param=where)
        elif kind == "bool":
            check_bool(value, where)
        elif kind == "str" and not isinstance(value, str):
            raise ConfigError(f"{where} has the wrong type ({type(value).__name__})", param=where)
        elif kind == "choice":
            check_choice(value, f.metadata["choices"], where)
        elif kind == "device" and (not isinstance(value, str) or not _DEVICE.fullmatch(value)):
            raise ConfigError(f"{where} must be auto, cpu, cuda or cuda:N, got {value!r}", param=where)
        elif kind == "switch":
            self._set(f.name, switch(value, where))
        elif kind == "sampling":
            self._set(f.name, _parse_sampling(value, where))

    def _resolve(self) -> None:
        """Replace ``auto`` values by what they mean on this stage's device, in dependency order."""
        if self.device == AUTO:
            import torch

            self._set("device", "cuda" if torch.cuda.is_available() else "cpu")
        if self.dtype == AUTO:
            self._set("dtype", "bfloat16" if self.on_cuda else "float32")


@dataclass(frozen=True, kw_only=True)
class DecoderConfig(StageConfig):
    """What the two language-model stages (thinker, talker) share: sampling, reply length, KV slots, decode graphs."""

    sampling: SamplingConfig = _kind("sampling", factory=SamplingConfig)
    max_tokens: int | None = _kind("positive", None)
    """Reply length cap in this stage's tokens; None: up to the context."""
    min_tokens: int | None = _kind("positive", None)
    """Stop tokens are suppressed until this many tokens were generated (like ``min_new_tokens``):
    forces reply lengths for benchmarks with random weights."""
    kv_slots: int | str = _kind("slots", AUTO)
    """Conversations whose KV cache stays on the device at once (a fixed pool allocated at start,
    ``kv_slots x max_context_tokens`` positions for the thinker), and the largest decode batch. An idle conversation
    beyond it loses its cache to a new one (least recently used first) and is prefilled again at its next response.
    ``auto`` (the default) stays ``auto`` here and is resolved once, when the engine loads: on CUDA, as many as the
    device's free memory holds after the weights, less ``engine.kv_reserve_gib``; on the CPU,
    :data:`~pipeline.runners.kv_sizing.CPU_KV_SLOTS` (:mod:`pipeline.runners.kv_sizing` states the rule). An
    integer is used as it is."""
    max_prefills_per_step: int = _kind("positive", 4)
    """Prefills per engine step. The budget keeps a burst of long prompts from stalling every session's next
    token."""
    cuda_graphs: bool = _kind("bool", True)
    """On CUDA: replay decode steps from CUDA graphs captured at start for batch sizes up to ``kv_slots`` (needs
    Triton, which CUDA builds of torch include); the thinker's prefill chunks and user audio encodes (batches of 1-16
    padded 2 s blocks) too."""
    fused_decode: bool = _kind("bool", True)
    """On CUDA: graph-captured decode steps run each layer as 9 kernels (fused q/k/v and gate/up weights, Triton
    add+RMSNorm, RoPE+KV write and SiLU×up; pipeline/kernels/fused_decode.py) instead of HF's ~37. Same arithmetic up
    to the order of float32 sums; ``false`` runs HF's layer code in the graphs."""


@dataclass(frozen=True, kw_only=True)
class ThinkerConfig(DecoderConfig):
    """The thinker: reads the conversation (text and user audio), writes the reply's text."""

    STAGE: ClassVar[str] = "thinker"

    input: str = _kind("fixed", "request")
    sampling: SamplingConfig = _kind("sampling", factory=lambda: THINKER_SAMPLING)
    max_tokens: int | None = _kind("positive", 1024)
    """Reply length cap in text tokens (a response may ask for fewer); None: up to the context size."""
    max_context_tokens: int | None = _kind("positive", 8192)
    """Conversation length limit (prompt + reply) in thinker tokens, which is also a KV slot's size; None: the
    model's ``max_position_embeddings``."""
    max_prefills_per_step: int = _kind("positive", 16)
    """Prefill chunks per engine step (responses first, then conversations still being spoken, in turn), run together
    as one batch (on CUDA at most 512 positions, one graph replay; what does not fit waits a step), so that a burst of
    turns starts at once while a burst of long prompts still cannot stall every session's next token."""
    context_policy: str = _kind("choice", "drop_oldest", choices=CONTEXT_POLICIES)
    """What happens when a response's prompt plus its room for reply tokens (the response's ``max_output_tokens``,
    else ``max_tokens``) would not fit in ``max_context_tokens``. ``drop_oldest``: the oldest turns give way, whole
    turns at a time (see ``context_retention_ratio``); the instructions and the turn being answered (the items after
    the last assistant item) are never dropped, and if they alone do not fit the response fails with
    ContextLimitError (``context_length_exceeded``), naming the sizes, and nothing is dropped. The dropped items are
    gone from the model's context only: deleting or truncating one later does nothing. ``error``: the response fails
    with ContextLimitError and nothing is dropped (what a client that disables truncation asks for)."""
    context_retention_ratio: float = _kind("fraction", 0.8)
    """Under ``drop_oldest``, how far a drop goes: the oldest turns are dropped until the prompt takes at most this
    fraction of the room beside the reply (``max_context_tokens`` minus the reply's room). The cached instructions
    are kept and the kept turns are prefilled again from the first dropped position; the room freed beyond what the
    reply needed lets the next turns extend the cached prompt instead of each dropping and re-prefilling it again.
    1.0 drops only as much as the reply needs (a re-prefill of the whole kept history on every turn once full)."""
    video_history_seconds: int | None = _kind("positive", 20)
    """Seconds of camera video the messages before the turn being answered may hold (pipeline/video/budget.py): past
    it the video of the oldest messages is removed, whole messages at a time, their audio kept, down to
    ``video_retention_ratio`` of it; the turn being answered keeps all its video. None: no limit (only the context
    policy bounds video). At 2 fps a 448 x 448 picture is 256 thinker positions per second of video."""
    video_retention_ratio: float = _kind("fraction", 0.5)
    """How far a video removal goes (a fraction of ``video_history_seconds``): the margin lets the next turns extend
    the cached prompt instead of each removing a message's video and prefilling the history after it again."""
    video_frame_grace_seconds: int = _kind("positive", 2)
    """While a message is spoken, a frame pair with no camera frame once the audio has run this long past its end
    ends the message's video there (pipeline/video/timeline.py), so its audio-only rest is prefilled as it comes."""
    audio_floor: str = _kind("choice", "streaming", choices=AUDIO_FLOORS)
    """How the log-mel floor (loudest value - 80 dB, as Whisper features clamp) is chosen for the
    2 s blocks encoded while the user still speaks: ``streaming`` uses the loudest value heard so
    far and keeps the block as encoded (no work at commit); ``exact`` re-encodes, at commit, every
    block the final floor changes, so features are bit-identical to the reference processor's, at
    the cost of re-prefilling from the first changed block (speech that gets louder later)."""
    prefill_chunk_tokens: int = _kind("positive", 512)
    """Prefill runs in chunks of at most this many positions, one chunk per engine step,
    so a long prefill never stalls the decoding of other sessions for long."""
    vision_worker: bool = _kind("switch", AUTO)
    """Given as auto / on / off; holds a bool. On: pictures and camera frame pairs are encoded by the vision tower on a
    thread and CUDA stream of their own (pipeline/runners/encode_worker.py), batched across users, and a prefill reads
    a picture only once its encode is done, so decode steps never wait for the tower; off: the tower runs on the
    engine thread at the start of the step that follows the picture's preprocessing. The embeddings are the same.
    ``auto`` = on with CUDA, off on the CPU (there a second busy thread only competes for the same cores). Picture
    preprocessing (resize, patches) always runs on a pool of its own (pipeline/runners/picture_prep.py)."""

    def _resolve(self) -> None:
        super()._resolve()
        if self.vision_worker == AUTO:
            self._set("vision_worker", self.on_cuda)


@dataclass(frozen=True, kw_only=True)
class TalkerConfig(DecoderConfig):
    """The talker: turns the thinker's reply into codec tokens (Qwen2.5-Omni: 50 per second of audio) or frames of
    several codebooks (Qwen3-Omni: 12.5 per second)."""

    STAGE: ClassVar[str] = "talker"

    input: str = _kind("fixed", "thinker")
    connector: str = _kind("str", "thinker_to_talker")
    """The model family's name of the function that makes the talker's input from the thinker's."""
    sampling: SamplingConfig = _kind("sampling", factory=lambda: TALKER_SAMPLING)
    residual_sampling: SamplingConfig = _kind("sampling", factory=lambda: RESIDUAL_SAMPLING)
    """For a talker that makes frames of several codebooks (Qwen3-Omni): how the codebooks after the first are
    sampled (``sampling`` samples the first); unused by a talker of one code per step."""
    max_tokens: int | None = _kind("positive", 4096)
    """Reply length cap in codec tokens (50 per second of audio), or in frames for a frame talker (12.5 per second
    for Qwen3-Omni)."""
    overlap: bool = _kind("switch", AUTO)
    """Given as auto / on / off; holds a bool. On: each engine step's talker decode runs beside the thinker's decode
    (on CUDA on a stream of its own), fed with thinker vectors of earlier steps, so a step costs about the longer of
    the two instead of their sum; the talker then starts one thinker step later and stays one step behind the text.
    Off: the talker decodes after the thinker in each step, on the vector the thinker made in that step. The codes
    are the same either way (the talker's inputs are; only when they run differs). ``auto`` = on with CUDA, off on
    the CPU (one core gains nothing from the overlap)."""
    chain_steps: int = _kind("positive", 8)
    """Up to this many decode steps queued at once, each fed on the device with the code the one before sampled, when
    the talker is the engine's only work: every live reply is past its text (no thinker step), no prefill, token2wav
    job or engine command waits, and the chain ends at the next chunk's last code (that chunk goes to token2wav at
    once), at ``min_tokens`` and at ``max_tokens``. Why: the host then queues the steps together and reads their codes
    once instead of doing a step's bookkeeping between every two steps of a few ms, so a reply's first chunk is ready
    sooner. The codes and audio are the same as with 1 (off); what comes in meanwhile (a cancel, a new turn) waits
    for the chain, at most ``chain_steps`` talker steps."""

    def _resolve(self) -> None:
        super()._resolve()
        if self.overlap == AUTO:
            self._set("overlap", self.on_cuda)


@dataclass(frozen=True, kw_only=True)
class Token2WavConfig(StageConfig):
    """token2wav: turns codec tokens into 24 kHz audio in chunks (a DiT solve, then the BigVGAN vocoder)."""

    STAGE: ClassVar[str] = "token2wav"

    input: str = _kind("fixed", "talker")
    connector: str = _kind("str", "talker_to_token2wav")
    """The model family's name of the function that hands the talker's codes to token2wav."""
    dtype: str = _kind("choice", "float32", choices=(AUTO, *DTYPES))
    """The synthesizer's weights and state: float32, as the reference (a family may set a compute precision of its
    own among its keys)."""
    worker_thread: bool = _kind("switch", AUTO)
    """Given as auto / on / off; holds a bool. On: chunk synthesis runs on a thread (and CUDA stream) of its own, so
    decode steps never wait for it; off: it runs inside the engine step; ``auto`` = on with CUDA, off on the CPU
    (there a second busy thread only competes for the same cores)."""
    max_batch: int = _kind("positive", 16)
    """Most streams whose chunks are synthesized in one batched pass (one DiT solve, one vocoder call per chunk
    length). As many as the talker's slots, so that every reply that is talking fits in one job: with fewer, a burst's
    replies wait for several jobs and fall behind real time."""
    starving_margin_ms: int = _kind("at_least_0", 250)
    """A later chunk (every chunk after a reply's first) whose stream has less than this much audio (ms) ahead of a
    real-time player outranks first chunks when the worker picks its next job
    (``pipeline/scheduler/token2wav_jobs.py``): waiting for a first-chunk job and then its own, it would starve.
    0: only a stream already starving does."""
    starving_margin_from_jobs: bool = _kind("bool", True)
    """The margin is also at least the longest of the last 8 first-chunk jobs plus the longest of the last 8
    later-chunk jobs (``RecentJobs`` in ``pipeline/scheduler/token2wav_jobs.py``): what a later chunk that lets first
    chunks go first waits before its own audio is out, which grows with the load. ``starving_margin_ms`` is then the
    floor."""
    first_audio_target_ms: int = _kind("at_least_0", 500)
    """A reply's first audio is wanted this long (ms) after the engine took the response: the playout deadline of a
    reply whose audio has not started, against which its first chunk is ranked beside the later chunks of replies
    already playing (earliest deadline first, ``pipeline/scheduler/token2wav_jobs.py``). Smaller: first chunks go
    before more of the later chunks within reach of their deadline; larger: the other way round. At most
    ``deadline_lead_s``, so that a first chunk never waits."""
    deadline_lead_s: float | None = _kind("seconds", 1.5)
    """In a step that decodes or prefills, a ready stream whose playout deadline (when its client runs out of audio)
    is further away than this (s) waits, so that the GPU goes to decode and the token2wav worker stays free for the
    streams that need it; a stream within it is always a candidate. None: every ready stream is a candidate at once.
    It must cover a job of first chunks and the stream's own job under load plus ``starving_margin_ms``."""
    start_buffer_ms: int | None = _kind("positive", 960)
    """Under load (``start_buffer_busy``), a reply's first audio is held in the engine until this much of it (ms) is
    made (960: its first two chunks), then sent at once, so that its player starts with that much in hand; None:
    never held. Why: once more conversations are busy than one token2wav job holds, a reply's next chunk can wait for
    a whole job of other streams and then its own, longer than a 480-ms first chunk plays
    (``pipeline/output/start_buffer.py``). The first audio comes that much later, and only under that load; a reply
    whose audio ends sooner is sent at its end, a cancelled one's held audio is dropped."""
    start_buffer_busy: int | None = _kind("positive", None)
    """How many other conversations must be busy (a user's audio being streamed in, or a response running) when a
    reply's first chunk is made for ``start_buffer_ms`` to hold it; None: ``max_batch`` (more conversations busy than
    one token2wav job holds)."""
    settings: Any = _kind("family", factory=UnparsedSettings)
    """The model family's own settings of this section (its synthesizer's: for Qwen2.5-Omni the DiT's precision,
    compile and attention kernel and the chunk schedule). Given as the section's keys that are the family's
    (:attr:`~pipeline.models.family.ModelFamily.token2wav_keys`), as an :class:`UnparsedSettings`; holds what the
    family's :meth:`~pipeline.models.family.ModelFamily.token2wav_config` makes of them once in a
    :class:`StageGraphConfig` (which reads the section's ``device`` resolved). Opaque to the engine: only the
    family's ``token2wav`` reads it."""

    def _resolve(self) -> None:
        super()._resolve()
        if self.worker_thread == AUTO:
            self._set("worker_thread", self.on_cuda)
        lead = self.deadline_lead_s
        if lead is not None and self.first_audio_target_ms > lead * 1000:
            where = f"{self.path}.first_audio_target_ms"
            raise ConfigError(
                f"{where} ({self.first_audio_target_ms}) must be at most deadline_lead_s ({lead} s): a first chunk "
                "would wait",
                param=where,
            )


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the engine runs, beside what its stages do (the YAML's top-level ``engine:`` section)."""

    process: bool | str = AUTO
    """Given as auto / on / off; holds a bool once in a :class:`StageGraphConfig` (``auto`` needs the thinker's
    device). On: the engine core (every model tensor, the step loop, the token2wav worker) runs in a child process
    that owns the GPU, and the caller's process keeps only the async API (sockets, VAD, JSON stay off the engine's
    GIL); off: it runs on a thread of the caller's process; ``auto`` = on when the thinker's device is CUDA, off on
    the CPU (where a second interpreter only costs start-up time and memory). See docs/engine.md, "The engine core in
    a child process"."""
    timeline_path: str | None = None
    """Where to write the engine's timeline (every step, token2wav job, audio chunk and response, with its time;
    :mod:`pipeline.observe.timeline`) as JSON when the engine closes; None (default): nothing is recorded. For reading
    a load afterwards (``scripts/engine_timeline.py``); a relative path is relative to the engine process's working
    directory."""
    slow_step_ms: float | str = AUTO
    """A step that takes longer than this (milliseconds) is logged as a warning, with what it held. Holds a number once
    in a :class:`StageGraphConfig`: ``auto`` = 250 with CUDA (a step there takes milliseconds, so 250 ms is a stall a
    listener hears), 1000 on the CPU (where one token2wav chunk of the tiny model alone takes a few hundred
    milliseconds on a busy core)."""
    kv_reserve_gib: float = KV_RESERVE_GIB
    """GiB of each CUDA device's free memory that ``kv_slots: auto`` leaves outside the KV pools, for what the engine
    allocates after them: the decode, prefill and audio-encode CUDA graphs, the activations of prefills, encoders and
    samplers, and token2wav's compiled graphs and batches (its weights are loaded before, so they are not in it).
    Unused with integer ``kv_slots``."""
    kv_auto_max_slots: int = KV_AUTO_MAX_SLOTS
    """The most conversations ``kv_slots: auto`` gives a stage, whatever the memory: the decode graphs are captured
    for every multiple of 8 up to the slot count, each with memory of its own, and ``kv_reserve_gib`` is sized for
    graphs up to this many rows. An integer ``kv_slots`` is not bound by it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "process", switch(self.process, "engine.process"))
        if not _is_number(self.kv_reserve_gib) or not self.kv_reserve_gib >= 0:
            raise ConfigError(
                f"engine.kv_reserve_gib must be a number of GiB >= 0, got {self.kv_reserve_gib!r}",
                param="engine.kv_reserve_gib",
            )
        if not _is_int(self.kv_auto_max_slots) or self.kv_auto_max_slots < 1:
            raise ConfigError(
                f"engine.kv_auto_max_slots must be a positive integer, got {self.kv_auto_max_slots!r}",
                param="engine.kv_auto_max_slots",
            )
        if self.slow_step_ms != AUTO and (
            isinstance(self.slow_step_ms, bool)
            or not isinstance(self.slow_step_ms, int | float)
            or not self.slow_step_ms > 0
        ):
            raise ConfigError(
                f"engine.slow_step_ms must be a positive number of milliseconds or auto, got {self.slow_step_ms!r}",
                param="engine.slow_step_ms",
            )
        if self.timeline_path is not None and not isinstance(self.timeline_path, str):
            raise ConfigError(
                f"engine.timeline_path has the wrong type ({type(self.timeline_path).__name__})",
                param="engine.timeline_path",
            )
        if self.timeline_path == "":
            raise ConfigError(
                "engine.timeline_path must not be empty (leave it out for no timeline)", param="engine.timeline_path"
            )


STAGE_CLASSES = {"thinker": ThinkerConfig, "talker": TalkerConfig, "token2wav": Token2WavConfig}


@dataclass(frozen=True)
class StageGraphConfig:
    model_family: str
    thinker: ThinkerConfig
    talker: TalkerConfig
    token2wav: Token2WavConfig
    source: str = "<dict>"
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        family = family_of(self.model_family)  # ConfigError naming the known families
        t2w = self.token2wav
        if isinstance(t2w.settings, UnparsedSettings):
            settings = family.token2wav_config(t2w.settings, path=t2w.path, device=t2w.torch_device)
            object.__setattr__(self, "token2wav", replace(t2w, settings=settings))
        connectors = family.connectors
        for stage in (self.talker, self.token2wav):
            _check_connector(stage.STAGE, stage.connector, f"{stage.path}.connector", connectors)
        engine = self.engine
        if engine.process == AUTO:
            engine = replace(engine, process=self.thinker.on_cuda)
        if engine.slow_step_ms == AUTO:
            engine = replace(engine, slow_step_ms=SLOW_STEP_MS_CUDA if self.thinker.on_cuda else SLOW_STEP_MS_CPU)
        object.__setattr__(self, "engine", engine)

    def stage(self, name: str) -> ThinkerConfig | TalkerConfig | Token2WavConfig:
        return getattr(self, name)

    @property
    def devices(self) -> tuple[str, ...]:
        """The stages' devices as configured, each once, in stage order (``cuda`` and ``cuda:0`` count apart here:
        which GPU ``cuda`` means is decided in the engine's process)."""
        return tuple(dict.fromkeys(self.stage(name).device for name in STAGE_ORDER))


def check_devices(cfg: StageGraphConfig) -> None:
    """Raise :class:`ConfigError` naming the first stage whose device this host does not have (``cuda`` without a
    CUDA device torch can use, ``cuda:N`` with N at or past the device count). Separate from loading, so that a config
    can be read and checked on a machine other than the one it is for; the engine's loaders and the CLI call it before
    any weight is loaded."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for name in STAGE_ORDER:
        stage = cfg.stage(name)
        if not stage.on_cuda:
            continue
        where = f"{stage.path}.device"
        if count == 0:
            raise ConfigError(f"{where} is {stage.device!r}, but torch sees no CUDA device on this host", param=where)
        index = stage.torch_device.index
        if index is not None and index >= count:
            have = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            raise ConfigError(
                f"{where} is {stage.device!r}, but this host has {count} CUDA device{'s' if count > 1 else ''} "
                f"({have})",
                param=where,
            )


def stage_config_for(model: str, path: str | Path | None = None) -> StageGraphConfig:
    """The stage config checkpoint ``model`` is served with: ``path``'s (its ``model_family`` must be the checkpoint's
    family), or the packaged one of the checkpoint's family (``model_type`` in its ``config.json``) when ``path`` is
    None. :class:`ConfigError` for a stage config of another family; ``CheckpointError`` when the checkpoint's family
    is unknown."""
    from pipeline.models import checkpoint_family

    family = checkpoint_family(model)
    if path is None:
        return load_stage_config(PACKAGED_STAGE_CONFIGS[family])
    cfg = load_stage_config(path)
    if cfg.model_family != family:
        raise ConfigError(
            f"stage config {path} is for model family {cfg.model_family!r}, but {model} is a {family!r} checkpoint",
            param="model_family",
        )
    return cfg


def load_stage_config(
    path: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None
) -> StageGraphConfig:
    """Read and validate a stage-graph YAML file (the packaged default when ``path`` is None).

    A file whose top level has ``extends: <path>`` (relative to the file's folder) is that file with this one's keys
    merged in: mappings key by key, anything else (numbers, strings, lists) replaced. ``overrides`` (the same shape
    as the YAML) is merged in last, before validation, so that its ``auto`` values resolve against its devices."""
    path = Path(path) if path is not None else DEFAULT_STAGE_CONFIG
    data = _read_with_extends(path, ())
    if overrides:
        data = merge_settings(data, overrides)
    return parse_stage_config(data, source=str(path))


def merge_settings(base: Any, overlay: Any) -> Any:
    """``overlay`` merged into ``base`` (neither is changed): mappings key by key, any other value replaced."""
    if not isinstance(base, Mapping) or not isinstance(overlay, Mapping):
        return overlay
    merged = dict(base)
    for key, value in overlay.items():
        merged[key] = merge_settings(base[key], value) if key in base else value
    return merged


def _read_with_extends(path: Path, chain: tuple[Path, ...]) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read stage config {path}: {exc.strerror}", param="stage_config") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"stage config {path} is not valid YAML: {exc}", param="stage_config") from exc
    if not isinstance(data, dict) or "extends" not in data:
        return data
    base = data.pop("extends")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: extends must be the path of a stage config", param="extends")
    base_path = (path.parent / base).resolve()
    chain = (*chain, path.resolve())
    if base_path in chain:
        raise ConfigError(
            f"{path}: extends {base!r} makes a cycle ({' -> '.join(p.name for p in chain)})", param="extends"
        )
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(f"{path}: more than {MAX_EXTENDS_DEPTH} files extend each other", param="extends")
    return merge_settings(_read_with_extends(base_path, chain), data)


def parse_stage_config(data: Any, *, source: str = "<dict>") -> StageGraphConfig:
    """Validate the YAML's data and make the resolved config."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the stage config must be a mapping", param="<root>")
    reject_unknown(data, {"model_family", "stages", "engine"}, "")
    family = data.get("model_family")
    family_keys = family_of(family).token2wav_keys  # ConfigError naming the known families, before the stages are read
    assert isinstance(family, str)  # family_of took it
    stages = data.get("stages")
    if not isinstance(stages, dict):
        raise ConfigError(f"{source}: 'stages' must be a mapping of stage name to settings", param="stages")
    reject_unknown(stages, set(STAGE_ORDER), "stages")
    parsed: dict[str, Any] = {}  # stage name -> its ThinkerConfig, TalkerConfig or Token2WavConfig
    for name in STAGE_ORDER:
        if name not in stages:
            raise ConfigError(f"{source}: stage {name!r} is missing", param=f"stages.{name}")
        if name == "token2wav":
            parsed[name] = _build_token2wav(stages[name], f"stages.{name}", family_keys)
        else:
            parsed[name] = _build(STAGE_CLASSES[name], stages[name], f"stages.{name}")
    engine = _build(EngineConfig, data.get("engine", {}), "engine")
    return StageGraphConfig(
        model_family=family,
        source=source,
        engine=engine,
        thinker=parsed["thinker"],
        talker=parsed["talker"],
        token2wav=parsed["token2wav"],
    )


def _build(cls, raw: Any, path: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping", param=path)
    reject_unknown(raw, {f.name for f in fields(cls)}, path)
    return cls(**raw)


def _build_token2wav(raw: Any, path: str, family_keys: frozenset[str]) -> Token2WavConfig:
    """The section's engine keys checked; the family's (``family_keys``, disjoint from the engine's) kept for the
    family to parse."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping", param=path)
    engine_keys = {f.name for f in fields(Token2WavConfig)} - {"settings"}
    reject_unknown(raw, engine_keys | family_keys, path)
    own = UnparsedSettings({key: value for key, value in raw.items() if key not in engine_keys})
    return Token2WavConfig(**{key: value for key, value in raw.items() if key in engine_keys}, settings=own)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_connector(stage: str, connector: Any, path: str, connectors: Mapping[str, Any]) -> None:
    """``connector`` must name one of the model family's ``connectors`` that feeds ``stage``."""
    if connector not in connectors:
        raise ConfigError(f"{path} must be one of {sorted(connectors)}, got {connector!r}", param=path)
    if connectors[connector].target != stage:
        raise ConfigError(f"{path} {connector!r} feeds {connectors[connector].target!r}, not {stage!r}", param=path)


def _parse_sampling(raw: Any, path: str) -> SamplingConfig:
    if isinstance(raw, SamplingConfig):
        sampling = raw
    else:
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} must be a mapping", param=path)
        reject_unknown(raw, {f.name for f in fields(SamplingConfig)}, path)
        _check_type(raw, "do_sample", bool, path)
        for key in ("temperature", "top_p", "repetition_penalty"):
            _check_type(raw, key, (int, float), path)
        _check_type(raw, "top_k", int, path)
        sampling = SamplingConfig(**raw)
    sampling.validate(path)
    return sampling


def _check_type(raw: dict, key: str, types, path: str) -> None:
    if key in raw and (not isinstance(raw[key], types) or (types is int and isinstance(raw[key], bool))):
        raise ConfigError(f"{path}.{key} has the wrong type ({type(raw[key]).__name__})", param=f"{path}.{key}")
