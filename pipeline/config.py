"""The stage graph, loaded from YAML into typed, validated config objects.

Errors are :class:`pipeline.errors.ConfigError` whose ``param`` is the dotted path of the bad field
(``stages.talker.sampling.top_p``). Connectors are looked up by name in :mod:`pipeline.registry`;
the YAML never names import paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import ConfigError

DEFAULT_STAGE_CONFIG = Path(__file__).parent / "stage_configs" / "qwen2_5_omni.yaml"
STAGE_ORDER = ("thinker", "talker", "token2wav")
"""Stage names in stream order; each stage's ``input`` must be the one before it."""
STAGE_INPUTS = {"thinker": "request", "talker": "thinker", "token2wav": "talker"}
DTYPES = ("auto", "float32", "bfloat16", "float16")
CONTEXT_POLICIES = ("error", "drop_oldest")
AUDIO_FLOORS = ("streaming", "exact")
WORKER_THREAD = ("auto", "on", "off")
OVERLAP = ("auto", "on", "off")
COMPILE = ("auto", "on", "off")
DIT_DTYPES = ("auto", "float32", "bfloat16", "float16")
DIT_ATTENTION = ("auto", "triton", "sdpa")
ENGINE_PROCESS = ("auto", "on", "off")


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


@dataclass(frozen=True)
class StageConfig:
    name: str
    input: str
    device: str = "auto"
    dtype: str = "auto"
    connector: str | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_tokens: int | None = None
    min_tokens: int | None = None
    """Stop tokens are suppressed until this many tokens were generated (like ``min_new_tokens``):
    forces reply lengths for benchmarks with random weights."""
    max_context_tokens: int | None = None
    context_policy: str = "error"
    """What happens when a reply would not fit in ``max_context_tokens``: ``error`` refuses the
    response (ContextLimitError); ``drop_oldest`` drops the oldest turns (after the instructions)
    until it fits, then re-prefills the shortened history."""
    audio_floor: str = "streaming"
    """How the log-mel floor (loudest value - 80 dB, as Whisper features clamp) is chosen for the
    2 s blocks encoded while the user still speaks: ``streaming`` uses the loudest value heard so
    far and keeps the block as encoded (no work at commit); ``exact`` re-encodes, at commit, every
    block the final floor changes, so features are bit-identical to the reference processor's, at
    the cost of re-prefilling from the first changed block (speech that gets louder later)."""
    prefill_chunk_tokens: int = 512
    """Thinker prefill runs in chunks of at most this many positions, one chunk per engine step,
    so a long prefill never stalls the decoding of other sessions for long."""
    chunking: dict[str, Any] = field(default_factory=dict)
    kv_slots: int = 16
    """thinker/talker: conversations whose KV cache stays on the device at once (a fixed pool allocated at
    start, ``kv_slots x max_context_tokens`` positions for the thinker). An idle conversation beyond it loses its
    cache to a new one (least recently used first) and is prefilled again at its next response."""
    max_prefills_per_step: int = 4
    """thinker: prefill chunks per engine step (responses first, then conversations still being spoken, in turn),
    run together as one batch (on CUDA at most 512 positions, one graph replay; what does not fit waits a step);
    talker: talker prefills per step. The budget keeps a burst of long prompts from stalling every session's next
    token."""
    cuda_graphs: bool = True
    """thinker/talker on CUDA: replay decode steps from CUDA graphs captured at start for batch sizes up to
    ``kv_slots`` (needs Triton, which CUDA builds of torch include); the thinker's prefill chunks and user audio encodes
    (batches of 1-16 padded 2 s blocks) too."""
    fused_decode: bool = True
    """thinker/talker on CUDA: graph-captured decode steps run each layer as 9 kernels (fused q/k/v and gate/up
    weights, Triton add+RMSNorm, RoPE+KV write and SiLU×up; pipeline/kernels/fused_decode.py) instead of HF's ~37.
    Same arithmetic up to the order of float32 sums; ``false`` runs HF's layer code in the graphs."""
    worker_thread: str = "auto"
    """token2wav: ``on`` runs chunk synthesis on a thread (and CUDA stream) of its own, so decode steps never wait
    for it; ``off`` runs it inside the engine step; ``auto`` = on with CUDA, off on the CPU (there a second busy
    thread only competes for the same cores). The worker once made replies stop for good above 16 live replies on
    the H100: every CUDA graph shared one capture stream, hence one cuBLAS workspace, which the decode and token2wav
    graphs then used at the same time. Each stage now captures on a stream of its own; BENCHMARKS.md §9.1 has the
    runs that show the stall before that change and none after."""
    overlap: str = "auto"
    """talker: ``on`` runs each engine step's talker decode beside the thinker's decode (on CUDA on a stream of its
    own), fed with thinker vectors of earlier steps, so a step costs about the longer of the two instead of their sum
    (BENCHMARKS.md §14); the talker then starts one thinker step later and stays one step behind the text. ``off``:
    the talker decodes after the thinker in each step, on the vector the thinker made in that step. The codes are the
    same either way (the talker's inputs are; only when they run differs). ``auto`` = on with CUDA, off on the CPU
    (one core gains nothing from the overlap). Only the talker stage takes it."""
    chain_steps: int = 1
    """talker: up to this many decode steps queued at once, each fed on the device with the code the one before
    sampled, when the talker is the engine's only work: every live reply is past its text (no thinker step), no
    prefill, token2wav job or engine command waits, and the chain ends at the next chunk's last code (that chunk goes
    to token2wav at once), at ``min_tokens`` and at ``max_tokens``. The host then queues the steps together and reads
    their codes once instead of doing a step's bookkeeping between every two ~1.65 ms steps (a 7B talker on the H100:
    the first chunk's codes ~3 ms sooner at one user, ~6 at four, BENCHMARKS.md §16.1). The codes and audio are the
    same as with 1 (off); what comes in meanwhile (a cancel, a new turn) waits for the chain, at most ``chain_steps``
    talker steps. Only the talker stage takes it."""
    max_batch: int = 8
    """token2wav: most streams whose chunks are synthesized in one batched pass."""
    starving_margin_ms: int = 0
    """token2wav: a later chunk (every chunk after a reply's first) whose stream has less than this much audio (ms)
    ahead of a real-time player outranks first chunks when the worker picks its next job
    (``pipeline/scheduler/token2wav_jobs.py``): waiting for a first-chunk job and then its own, it would starve.
    0: only a stream already starving does. Only the token2wav stage takes it."""
    starving_margin_from_jobs: bool = False
    """token2wav: the margin is also at least the longest of the last 8 first-chunk jobs plus the longest of the last
    8 later-chunk jobs (``RecentJobs`` in ``pipeline/scheduler/token2wav_jobs.py``): what a later chunk that lets
    first chunks go first waits before its own audio is out, which grows with the load. ``starving_margin_ms`` is
    then the floor. Only the token2wav stage takes it."""
    start_buffer_ms: int | None = None
    """token2wav: under load (``start_buffer_busy``), a reply's first audio is held in the engine until this much of
    it (ms) is made, then sent at once, so that its player starts with that much in hand; None (default): never held.
    Why: once more conversations are busy than one token2wav job holds, a reply's next chunk can wait for a whole job
    of other streams and then its own, longer than a 480-ms first chunk plays (``pipeline/output/start_buffer.py``). The
    first audio comes that much later, and only under that load; a reply whose audio ends sooner is sent at its end,
    a cancelled one's held audio is dropped. Only the token2wav stage takes it."""
    start_buffer_busy: int | None = None
    """token2wav: how many other conversations must be busy (a user's audio being streamed in, or a response running)
    when a reply's first chunk is made for ``start_buffer_ms`` to hold it; None: ``max_batch`` (more conversations
    busy than one token2wav job holds). Only the token2wav stage takes it."""
    dit_dtype: str = "auto"
    """token2wav: precision of the DiT's transformer blocks (``float32``, ``bfloat16``, ``float16``, or ``auto`` =
    bfloat16 with CUDA, float32 on the CPU, where half precision is slower). A half precision runs copies of the
    blocks on the tensor cores; the ODE state, the time embedding and the vocoder stay float32 (StreamingToken2Wav's
    ``dit_dtype``). On the H100 bfloat16 made a chunk ~1.5x faster than TF32 and moved the audio by 0.3% of its
    peak against 0.2% for TF32 (BENCHMARKS.md §9.2); bfloat16 rather than float16 (as fast, closer) because its
    range cannot overflow on activations nobody here has seen. Only the token2wav stage takes it."""

    def dit_torch_dtype(self):
        """``dit_dtype`` with ``auto`` resolved against this stage's device."""
        import torch

        if self.dit_dtype == "auto":
            return torch.bfloat16 if self.torch_device().startswith("cuda") else torch.float32
        return getattr(torch, self.dit_dtype)
    tf32_matmul: bool = False
    """token2wav on CUDA: TF32 matmuls in the DiT (about 2x faster; mel within ~2e-4 of float32)."""
    compile: str = "auto"
    """token2wav: ``on`` runs each DiT transformer block through ``torch.compile`` (inductor fuses its elementwise
    kernels; the CUDA graphs then record the compiled kernels), compiled at engine start before the graphs are
    captured (seconds to a minute or more), and with CUDA each of the vocoder's anti-aliased activations as two Triton
    kernels (:mod:`pipeline.models.qwen2_5_omni.vocoder`); the audio equals ``off``'s up to float rounding. ``off``
    runs both as transformers writes them; ``auto`` = on with CUDA, off on the CPU (there the compile is C++ builds of
    about a minute at start; ``on`` works there too). A failure to compile stops the engine's start with a
    ConfigError whose message names this field: nothing falls back to ``off`` on its own. Only the token2wav stage
    takes it."""

    dit_attention: str = "auto"
    """token2wav: how the DiT blocks attend. ``triton``: one Triton kernel per block that reads the query/key/value
    product in place, rotates the first head, computes the block mask from each frame's block id and writes the layout
    the output projection reads (:mod:`pipeline.models.qwen2_5_omni.dit_attention`); needs CUDA and a half-precision
    ``dit_dtype``. ``sdpa``: ``scaled_dot_product_attention`` over a mask, with the RoPE, concatenation and transpose as
    kernels of their own. ``auto`` = ``triton`` where it can run and the DiT is compiled, else ``sdpa``. Equal up to
    float rounding; BENCHMARKS.md §15 has the speed. Only the token2wav stage takes it."""

    def dit_attention_kind(self) -> str:
        """``dit_attention`` with ``auto`` resolved against this stage's device, ``dit_dtype`` and ``compile``."""
        if self.dit_attention != "auto":
            return self.dit_attention
        import torch

        from pipeline.models.qwen2_5_omni.dit_attention import dit_attention_available

        usable = dit_attention_available(torch.device(self.torch_device()), self.dit_torch_dtype())
        return "triton" if usable and self.compile_enabled() else "sdpa"

    def worker_enabled(self) -> bool:
        """Whether token2wav synthesizes on its worker thread: ``worker_thread`` with ``auto`` resolved against this
        stage's device."""
        if self.worker_thread == "auto":
            return self.torch_device().startswith("cuda")
        return self.worker_thread == "on"

    def overlap_enabled(self) -> bool:
        """Whether the talker decodes beside the thinker (``overlap`` with ``auto`` resolved against this stage's
        device)."""
        if self.overlap == "auto":
            return self.torch_device().startswith("cuda")
        return self.overlap == "on"

    def compile_enabled(self) -> bool:
        """Whether token2wav compiles its DiT (and, with CUDA, fuses its vocoder's activations): ``compile`` with
        ``auto`` resolved against this stage's device."""
        if self.compile == "auto":
            return self.torch_device().startswith("cuda")
        return self.compile == "on"

    def torch_device(self) -> str:
        """Resolve ``auto`` to ``cuda`` when available, else ``cpu``."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def torch_dtype(self):
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().startswith("cuda") else torch.float32
        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs, beside what its stages do (the YAML's top-level ``engine:`` section)."""

    process: str = "auto"
    """``on``: the engine core (every model tensor, the step loop, the token2wav worker) runs in a child process
    that owns the GPU, and the caller's process keeps only the async API (sockets, VAD, JSON stay off the
    engine's GIL); ``off``: it runs on a thread of the caller's process; ``auto`` = on when the thinker's device
    is CUDA, off on the CPU (where a second interpreter only costs start-up time and memory). See docs/engine.md,
    "The engine core in a child process"."""
    timeline_path: str | None = None
    """Where to write the engine's timeline (every step, token2wav job, audio chunk and response, with its time;
    :mod:`pipeline.observe.timeline`) as JSON when the engine closes; None (default): nothing is recorded. For reading a load
    afterwards (``scripts/engine_timeline.py``); a relative path is relative to the engine process's working
    directory."""


@dataclass(frozen=True)
class StageGraphConfig:
    model_family: str
    thinker: StageConfig
    talker: StageConfig
    token2wav: StageConfig
    source: str = "<dict>"
    engine: EngineConfig = field(default_factory=EngineConfig)

    def stage(self, name: str) -> StageConfig:
        return getattr(self, name)

    def engine_in_process(self) -> bool:
        """Whether the engine core runs in a child process (``engine.process``, ``auto`` resolved)."""
        if self.engine.process == "auto":
            return self.thinker.torch_device().startswith("cuda")
        return self.engine.process == "on"


def load_stage_config(path: str | Path | None = None) -> StageGraphConfig:
    """Read and validate a stage-graph YAML file (the packaged default when ``path`` is None)."""
    path = Path(path) if path is not None else DEFAULT_STAGE_CONFIG
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read stage config {path}: {exc.strerror}", param="stage_config") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"stage config {path} is not valid YAML: {exc}", param="stage_config") from exc
    return parse_stage_config(data, source=str(path))


def parse_stage_config(data: Any, *, source: str = "<dict>") -> StageGraphConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the stage config must be a mapping", param="<root>")
    _reject_unknown(data, {"model_family", "stages", "engine"}, "")
    family = data.get("model_family")
    if family != "qwen2_5_omni":
        raise ConfigError(f"{source}: model_family must be 'qwen2_5_omni', got {family!r}", param="model_family")
    stages = data.get("stages")
    if not isinstance(stages, dict):
        raise ConfigError(f"{source}: 'stages' must be a mapping of stage name to settings", param="stages")
    _reject_unknown(stages, set(STAGE_ORDER), "stages")
    parsed = {}
    for name in STAGE_ORDER:
        if name not in stages:
            raise ConfigError(f"{source}: stage {name!r} is missing", param=f"stages.{name}")
        parsed[name] = _parse_stage(name, stages[name])
    engine = _parse_engine(data.get("engine", {}))
    return StageGraphConfig(model_family=family, source=source, engine=engine, **parsed)


def _parse_engine(raw: Any) -> EngineConfig:
    if not isinstance(raw, dict):
        raise ConfigError("engine must be a mapping", param="engine")
    _reject_unknown(raw, {f.name for f in fields(EngineConfig)}, "engine")
    process = raw.get("process", "auto")
    if isinstance(process, bool):  # YAML 1.1 reads a bare on / off as a boolean
        process = "on" if process else "off"
    if process not in ENGINE_PROCESS:
        raise ConfigError(f"engine.process must be one of {ENGINE_PROCESS}, got {process!r}", param="engine.process")
    _check_type(raw, "timeline_path", (str, type(None)), "engine")
    if raw.get("timeline_path") == "":
        raise ConfigError("engine.timeline_path must not be empty (leave it out for no timeline)",
                          param="engine.timeline_path")
    return EngineConfig(process=process, timeline_path=raw.get("timeline_path"))


def _check_switch(values: dict, key: str, choices: tuple[str, ...], *, only: str, stage: str, path: str) -> None:
    """A setting of one stage (``only``) with named choices (auto / on / off, or others): refused on another stage; YAML
    1.1's bare ``on`` / ``off`` (read as booleans) taken as the words."""
    if key not in values:
        return
    if stage != only:
        raise ConfigError(f"{path}.{key} only applies to {only}", param=f"{path}.{key}")
    if isinstance(values[key], bool):
        values[key] = "on" if values[key] else "off"
    if values[key] not in choices:
        raise ConfigError(f"{path}.{key} must be one of {choices}, got {values[key]!r}", param=f"{path}.{key}")


def _parse_stage(name: str, raw: Any) -> StageConfig:
    path = f"stages.{name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping", param=path)
    allowed = {f.name for f in fields(StageConfig)} - {"name"}
    _reject_unknown(raw, allowed, path)
    values = dict(raw)
    expected_input = STAGE_INPUTS[name]
    if values.get("input") != expected_input:
        raise ConfigError(
            f"{path}.input must be {expected_input!r} (stages stream thinker -> talker -> token2wav)",
            param=f"{path}.input",
        )
    _check_type(values, "device", str, path)
    _check_type(values, "dtype", str, path)
    if values.get("dtype", "auto") not in DTYPES:
        raise ConfigError(f"{path}.dtype must be one of {DTYPES}", param=f"{path}.dtype")
    _check_type(values, "tf32_matmul", bool, path)
    _check_type(values, "cuda_graphs", bool, path)
    _check_type(values, "fused_decode", bool, path)
    if isinstance(values.get("worker_thread"), bool):  # YAML 1.1 reads a bare on / off as a boolean
        values["worker_thread"] = "on" if values["worker_thread"] else "off"
    if values.get("starving_margin_ms") is not None and name != "token2wav":
        raise ConfigError(f"{path}.starving_margin_ms only applies to token2wav", param=f"{path}.starving_margin_ms")
    if "starving_margin_from_jobs" in values and name != "token2wav":
        raise ConfigError(f"{path}.starving_margin_from_jobs only applies to token2wav",
                          param=f"{path}.starving_margin_from_jobs")  # fmt: skip
    _check_type(values, "starving_margin_from_jobs", bool, path)
    margin = values.get("starving_margin_ms", 0)
    if not isinstance(margin, int) or isinstance(margin, bool) or margin < 0:
        raise ConfigError(f"{path}.starving_margin_ms must be an integer >= 0", param=f"{path}.starving_margin_ms")
    if "dit_dtype" in values:
        if name != "token2wav":
            raise ConfigError(f"{path}.dit_dtype only applies to token2wav", param=f"{path}.dit_dtype")
        if values["dit_dtype"] not in DIT_DTYPES:
            raise ConfigError(f"{path}.dit_dtype must be one of {DIT_DTYPES}, got {values['dit_dtype']!r}",
                              param=f"{path}.dit_dtype")  # fmt: skip
    _check_switch(values, "overlap", OVERLAP, only="talker", stage=name, path=path)
    if values.get("worker_thread", "auto") not in WORKER_THREAD:
        raise ConfigError(f"{path}.worker_thread must be one of {WORKER_THREAD}", param=f"{path}.worker_thread")
    _check_switch(values, "compile", COMPILE, only="token2wav", stage=name, path=path)
    _check_switch(values, "dit_attention", DIT_ATTENTION, only="token2wav", stage=name, path=path)
    if "chain_steps" in values and name != "talker":
        raise ConfigError(f"{path}.chain_steps only applies to talker", param=f"{path}.chain_steps")
    for key in ("start_buffer_ms", "start_buffer_busy"):
        if values.get(key) is not None and name != "token2wav":
            raise ConfigError(f"{path}.{key} only applies to token2wav", param=f"{path}.{key}")
    for key in ("max_tokens", "min_tokens", "max_context_tokens", "prefill_chunk_tokens", "max_batch", "kv_slots",
                "max_prefills_per_step", "chain_steps", "start_buffer_ms", "start_buffer_busy"):
        value = values.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ConfigError(f"{path}.{key} must be a positive integer", param=f"{path}.{key}")
    if values.get("audio_floor", "streaming") not in AUDIO_FLOORS:
        raise ConfigError(f"{path}.audio_floor must be one of {AUDIO_FLOORS}", param=f"{path}.audio_floor")
    if values.get("context_policy", "error") not in CONTEXT_POLICIES:
        raise ConfigError(f"{path}.context_policy must be one of {CONTEXT_POLICIES}", param=f"{path}.context_policy")
    _check_connector(name, values.get("connector"), path)
    values["sampling"] = _parse_sampling(values.get("sampling", {}), f"{path}.sampling")
    chunking = values.get("chunking", {})
    if not isinstance(chunking, dict):
        raise ConfigError(f"{path}.chunking must be a mapping", param=f"{path}.chunking")
    if name == "token2wav":
        _validate_chunking(chunking, f"{path}.chunking")
    elif chunking:
        raise ConfigError(f"{path}.chunking only applies to token2wav", param=f"{path}.chunking")
    return StageConfig(name=name, **values)


def _check_connector(stage: str, connector: Any, path: str) -> None:
    from pipeline.registry import CONNECTORS

    if stage == "thinker":
        if connector is not None:
            raise ConfigError(f"{path}.connector: the thinker reads the request directly", param=f"{path}.connector")
        return
    if connector not in CONNECTORS:
        raise ConfigError(
            f"{path}.connector must be one of {sorted(CONNECTORS)}, got {connector!r}", param=f"{path}.connector"
        )
    if CONNECTORS[connector].target != stage:
        raise ConfigError(
            f"{path}.connector {connector!r} feeds {CONNECTORS[connector].target!r}, not {stage!r}",
            param=f"{path}.connector",
        )


def _parse_sampling(raw: Any, path: str) -> SamplingConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping", param=path)
    _reject_unknown(raw, {f.name for f in fields(SamplingConfig)}, path)
    _check_type(raw, "do_sample", bool, path)
    for key in ("temperature", "top_p", "repetition_penalty"):
        _check_type(raw, key, (int, float), path)
    _check_type(raw, "top_k", int, path)
    sampling = SamplingConfig(**raw)
    sampling.validate(path)
    return sampling


def _validate_chunking(raw: dict, path: str) -> None:
    from pipeline.models.qwen2_5_omni.chunk_schedule import ChunkingConfig

    _reject_unknown(raw, {f.name for f in fields(ChunkingConfig)}, path)
    try:
        ChunkingConfig(**raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}", param=path) from exc


def _reject_unknown(raw: dict, allowed: set[str], path: str) -> None:
    for key in raw:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(f"unknown field {where!r} (allowed: {sorted(allowed)})", param=where)


def _check_type(raw: dict, key: str, types, path: str) -> None:
    if key in raw and (not isinstance(raw[key], types) or (types is int and isinstance(raw[key], bool))):
        raise ConfigError(f"{path}.{key} has the wrong type ({type(raw[key]).__name__})", param=f"{path}.{key}")
