"""Qwen2.5-Omni's own keys of the stage config's ``stages.token2wav`` section (beside the engine's, which
:class:`pipeline.config.Token2WavConfig` holds): the DiT's precision, compile and attention kernel, TF32, and the chunk
schedule. :func:`parse_token2wav_settings` validates them and resolves ``auto`` for the stage's device once; the
family's :meth:`~pipeline.models.qwen2_5_omni.family.Qwen25OmniFamily.token2wav` reads the result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from pipeline.errors import ConfigError
from pipeline.models.common.settings import AUTO, DTYPES, check_bool, check_choice, reject_unknown, switch
from pipeline.models.qwen2_5_omni.chunk_schedule import ChunkingConfig

__all__ = ["DIT_ATTENTION", "KEYS", "PACKAGED_CHUNKING", "Token2WavSettings", "parse_token2wav_settings"]

DIT_ATTENTION = ("triton", "sdpa")

PACKAGED_CHUNKING: dict[str, Any] = {
    "first_chunk_frames": 48,
    "first_vocoder_lookahead_frames": 20,
    "ramp_frames": [48, 48],
    "lookahead_chunks": 3,
    "chunk_frames": 72,
    "quick_first_chunk_frames": 24,
    "quick_first_chunk_max_open": 0,
    "past_frames": 48,
    "future_frames": 24,
    "ode_steps": 10,
    "guidance_scale": 0.5,
    "sway_coefficient": -1.0,
}
"""token2wav's chunk schedule (:class:`~pipeline.models.qwen2_5_omni.chunk_schedule.ChunkingConfig` fields, in mel
frames): the stage's default ``chunking``; a ``chunking`` mapping given in the YAML changes the keys it names."""


@dataclass(frozen=True, kw_only=True)
class Token2WavSettings:
    """The section's Qwen2.5-Omni keys, validated, with ``auto`` resolved for the stage's device."""

    tf32_matmul: bool = True
    """On CUDA: TF32 matmuls in the DiT (about 2x faster; mel within ~2e-4 of float32); ignored on the CPU."""
    dit_dtype: str = AUTO
    """Precision of the DiT's transformer blocks; ``auto`` = bfloat16 with CUDA, float32 on the CPU (where half
    precision is slower). A half precision runs copies of the blocks on the tensor cores; the ODE state, the time
    embedding and the vocoder stay float32 (StreamingToken2Wav's ``dit_dtype``). bfloat16 rather than float16 (as fast,
    closer to float32 on the audio) because its range cannot overflow on activations nobody here has seen."""
    compile: bool | str = AUTO
    """Given as auto / on / off; holds a bool. On: each DiT transformer block runs through ``torch.compile``
    (inductor fuses its elementwise kernels; the CUDA graphs then record the compiled kernels), compiled at engine
    start before the graphs are captured (seconds to a minute or more), and with CUDA each of the vocoder's
    anti-aliased activations runs as two Triton kernels (:mod:`pipeline.models.qwen2_5_omni.vocoder`); the audio
    equals off's up to float rounding. Off runs both as transformers writes them; ``auto`` = on with CUDA, off on the
    CPU (there the compile is C++ builds of about a minute at start; on works there too). A failure to compile stops
    the engine's start with a ConfigError whose message names this field: nothing falls back to off on its own."""
    dit_attention: str = AUTO
    """How the DiT blocks attend. ``triton``: one Triton kernel per block that reads the query/key/value product in
    place, rotates the first head, computes the block mask from each frame's block id and writes the layout the output
    projection reads (:mod:`pipeline.models.qwen2_5_omni.dit_attention`); needs CUDA and a half-precision
    ``dit_dtype``. ``sdpa``: ``scaled_dot_product_attention`` over a mask, with the RoPE, concatenation and transpose
    as kernels of their own. ``auto`` = ``triton`` where it can run and the DiT is compiled, else ``sdpa``. Equal up
    to float rounding; the one kernel saves the launches and memory passes of the others."""
    chunking: dict[str, Any] = field(default_factory=lambda: dict(PACKAGED_CHUNKING))
    """The chunk schedule (:data:`PACKAGED_CHUNKING`): a smaller first chunk than the official 72 frames, vocoded
    with 20 of its look-ahead frames so that it plays 480 ms; two 48-frame ramp chunks, each also vocoded with its
    look-ahead, so that a stream has more in hand where a burst's long jobs starve it; a 24-frame first chunk only
    for a reply that finds token2wav idle (under load the extra job costs more than it saves)."""

    @property
    def compiled(self) -> bool:
        """``compile`` resolved; ValueError while it is still ``auto`` (:func:`parse_token2wav_settings` resolves
        it)."""
        if not isinstance(self.compile, bool):
            raise ValueError(f"token2wav compile is unresolved ({self.compile!r})")
        return self.compile

    @property
    def torch_dit_dtype(self) -> torch.dtype:
        """``dit_dtype`` as a ``torch.dtype``."""
        return getattr(torch, self.dit_dtype)


KEYS = frozenset(f.name for f in fields(Token2WavSettings))
"""The section's keys that are Qwen2.5-Omni's."""


def parse_token2wav_settings(raw: Mapping[str, Any], *, path: str, device: torch.device) -> Token2WavSettings:
    """``raw`` (keys of :data:`KEYS` only, as the YAML gives them; the stage config refuses any other) checked in
    field order and resolved for ``device``; :class:`ConfigError` naming ``{path}.{key}`` for a bad value."""
    defaults = Token2WavSettings()
    values = {f.name: raw.get(f.name, getattr(defaults, f.name)) for f in fields(Token2WavSettings)}
    check_bool(values["tf32_matmul"], f"{path}.tf32_matmul")
    check_choice(values["dit_dtype"], (AUTO, *DTYPES), f"{path}.dit_dtype")
    switched = switch(values["compile"], f"{path}.compile")
    check_choice(values["dit_attention"], (AUTO, *DIT_ATTENTION), f"{path}.dit_attention")
    chunking = _parse_chunking(values["chunking"], f"{path}.chunking")
    on_cuda = device.type == "cuda"
    compile_ = switched if isinstance(switched, bool) else on_cuda  # switch gives a bool or auto
    dit_dtype = values["dit_dtype"]
    if dit_dtype == AUTO:
        dit_dtype = "bfloat16" if on_cuda else "float32"
    dit_attention = values["dit_attention"]
    if dit_attention == AUTO:  # needs the device, dit_dtype and compile resolved first
        from pipeline.models.qwen2_5_omni.dit_attention import dit_attention_available

        usable = dit_attention_available(device, getattr(torch, dit_dtype))
        dit_attention = "triton" if usable and compile_ else "sdpa"
    return Token2WavSettings(
        tf32_matmul=values["tf32_matmul"],
        dit_dtype=dit_dtype,
        compile=compile_,
        dit_attention=dit_attention,
        chunking=chunking,
    )


def _parse_chunking(raw: Any, path: str) -> dict[str, Any]:
    """``raw`` merged over :data:`PACKAGED_CHUNKING`, checked by :class:`ChunkingConfig`."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path} must be a mapping", param=path)
    reject_unknown(raw, {f.name for f in fields(ChunkingConfig)}, path)
    try:
        ChunkingConfig(**{**PACKAGED_CHUNKING, **raw})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}", param=path) from exc
    return {**PACKAGED_CHUNKING, **raw}
