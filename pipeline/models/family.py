"""What the engine needs from a model family: the one interface between the engine and a model's own code.

A family is a stateless object (one per family, listed in :mod:`pipeline.models`). Its loaders return a
*checkpoint*, an object of the family's own type that the engine treats as opaque except for four attributes:
``source`` (what was asked for: a folder or hub id, in words), ``random_weights`` (bool), and ``thinker`` /
``talker``, HF decoder-shaped modules that the engine's runners drive (``pipeline/runners/``). Everything else the
engine learns by handing the checkpoint back to the family's methods below, on the engine thread.

The streaming synthesizer a family makes (:meth:`ModelFamily.token2wav`) is driven by the engine core and its
token2wav worker. It must offer ``max_batch`` (streams per batched step), ``cfg`` (with
``quick_first_chunk_frames`` (None: no quick first chunk) and ``quick_first_chunk_max_open``),
``warm_up(max_batch=...)`` and ``step_many(streams) -> list of float32 24 kHz sample arrays`` (one chunk per
stream, in order). Its streams (:meth:`ModelFamily.start_stream`) offer ``status`` (a :class:`StreamStatus`),
``done``, ``codes_received``, ``chunks_emitted``, ``push(codes)``, ``finish()``, ``ready()``, ``step()``,
``codes_until_ready()`` (None while no chunk is pending) and ``close()``
(idempotent), with the calling order of :class:`pipeline.models.qwen2_5_omni.token2wav_stream.Token2WavStream`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from pipeline.api import TranscriptionPrompt, VisionInfo
from pipeline.models.frame_talker import FrameTalkerParts

if TYPE_CHECKING:
    import torch


Checkpoint: TypeAlias = Any
"""A loaded checkpoint of some family: opaque to the engine but for ``source``, ``random_weights``, ``thinker`` and
``talker`` (see the module docstring)."""


class StreamStatus(enum.Enum):
    """Lifecycle of a token2wav stream, in order: OPEN -> FINISHED -> DONE; CLOSED from any state."""

    OPEN = "open"  # accepting codes
    FINISHED = "finished"  # no more codes; chunks may remain to synthesize
    DONE = "done"  # every sample emitted
    CLOSED = "closed"  # tensors released


@dataclass(frozen=True)
class Connector:
    """A named glue function between two stages; the stage config picks connectors by ``name``."""

    name: str
    source: str
    target: str
    fn: Callable


@dataclass(frozen=True)
class ThinkerParts:
    """What the thinker runner drives, from a family's checkpoint (:meth:`ModelFamily.thinker_parts`)."""

    text_model: Any
    """The decoder stack, HF decoder-shaped: ``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``, ``config``."""
    lm_head: Any
    """Hidden states -> vocabulary logits."""
    audio: Any
    """The user-audio encoder: ``capture()`` (its CUDA graphs, at start), ``encode_many(features) -> list`` (log-mel
    blocks of at most one encoder window each, encoded together; one (tokens, hidden) tensor each, in order) and
    ``audio_tokens(frames) -> int`` (tokens it makes of that many feature frames)."""
    talker_hidden_layer: int | None = None
    """The thinker hidden state the talker connector reads in prompt prefills (HF ``hidden_states`` index: 0 the
    embeddings, ``i`` the output of layer ``i - 1``); None: the last, after the final norm."""
    vision: Any = None
    """The vision tower (None: the checkpoint has none): ``encode_many(items) -> list`` (items ``(pixel_values,
    grid_thw)`` as :meth:`ModelFamily.vision_preprocessor` makes them; one (tokens, hidden) tensor each, in order;
    several may run as one batch) and ``tokens(grid_thw) -> int`` (thinker positions of an item of that grid)."""


@runtime_checkable
class ModelFamily(Protocol):
    """A model family: how its checkpoints load and what its stages need around the runners."""

    name: str
    """The stage config's ``model_family``."""

    default_instructions: str
    """The system prompt a conversation gets when the client sets none."""

    transcription_prompt: TranscriptionPrompt
    """How the thinker is asked to write down what a user said (input audio transcription, run by the server in a
    side conversation over the user's audio)."""

    connectors: Mapping[str, Connector]
    """Connector name -> connector: ``thinker -> talker`` is ``fn(hidden (T, H), embeds (T, H), multimodal (T,) bool or
    None) -> vectors the conversation keeps per position (T, H')`` (``hidden``: the thinker's hidden state the family
    asks for (:attr:`ThinkerParts.talker_hidden_layer`), ``embeds``: the tokens' input embeddings, ``multimodal``:
    audio/image/video positions, None in decode steps); ``talker -> token2wav`` is ``fn(code, stop_ids) -> the
    synthesizer's code, or None when ``code`` ends the utterance`` (not used by a frame talker, whose frames go to the
    synthesizer as they are)."""

    def load_pretrained(
        self, model: str, *, devices: dict[str, torch.device | str], dtypes: dict[str, torch.dtype]
    ) -> Any:
        """The checkpoint of folder ``model``, or of hub id ``model`` already in the local cache (never downloads),
        validated, its stages placed as ``devices`` / ``dtypes`` (keyed by stage name) say. Raises
        ``CheckpointError`` naming the file or field that is missing or inconsistent."""
        ...

    def build_random(
        self, spec: Any, *, device: torch.device | str, dtype: torch.dtype, devices: dict[str, str] | None = None
    ) -> Any:
        """A checkpoint with random weights of the family's architecture ``spec`` (e.g. a tiny or full-size preset),
        built in memory on ``device``, then each stage's part moved to its device in ``devices`` (keyed by stage
        name; a stage not named stays on ``device``); ``random_weights`` is true."""
        ...

    def max_context(self, ckpt: Any) -> int:
        """The thinker's longest context (positions) the checkpoint supports."""
        ...

    def special(self, ckpt: Any) -> Any:
        """The special ids the engine reads by name: ``im_end`` and ``endoftext`` (a reply's text ends),
        ``tts_text_end`` / ``tts_text_pad`` (thinker-vocabulary ids fed to the talker once the text ended),
        ``codec_bos`` / ``codec_pad`` / ``codec_mask`` (the talker's prefill and its sampler's seen ids), and
        ``audio_start`` / ``audio_token`` / ``audio_end`` (a spoken message: its audio positions, between markers)."""
        ...

    def codec_stop_ids(self, ckpt: Any) -> tuple[int, ...]:
        """Talker ids that end an utterance (the talker's sampler stops on them; never reach token2wav)."""
        ...

    def codec_suppress_ids(self, ckpt: Any) -> list[int]:
        """Talker ids the talker's sampler must never emit (ids token2wav cannot make audio of, except stop ids)."""
        ...

    def renderer(self, ckpt: Any) -> Any:
        """The prompt renderer of the family's chat format, for the conversation state: ``header(role)``,
        ``footer()`` (after a message or a reply), ``text_message(role, text)`` (all token id lists),
        ``decode(token_ids) -> str`` and ``special`` (as :meth:`special`). Function calling needs ``tools`` (None or
        absent: the family has none), the family's call format, with ``open_message(role, text)`` and ``text(text)``
        (the renderer's; a turn written in parts): ``system_text(instructions, tools)``, ``call_open`` /
        ``call_close`` (token ids that open and close a call in a reply), ``call(name, arguments)`` /
        ``call_separator()`` (a client's call, token ids), ``response_text(output, first=, more=)`` (a tool
        response in a user turn of them), ``forced(name)`` (token ids that open a required call) and
        ``parser(tool_names)`` (:class:`pipeline.models.common.hermes_tools.CallParser`'s interface)."""
        ...

    def voices(self, ckpt: Any) -> tuple[str, ...]:
        """The voice names a reply may ask for."""
        ...

    def default_voice(self, ckpt: Any) -> str:
        """The voice of a reply that names none; one of :meth:`voices`."""
        ...

    def voice_bos(self, ckpt: Any, voice: str) -> int:
        """The thinker-vocabulary id that opens the talker's stream for ``voice`` (after the prompt)."""
        ...

    def audio_features(self, ckpt: Any) -> Any:
        """Incremental log-mel features of one spoken message (16 kHz mono float32 in; the interface of
        :class:`pipeline.models.common.log_mel.IncrementalLogMel`), for the thinker's audio encoder."""
        ...

    def frame_talker_parts(self, ckpt: Any, *, device: torch.device, dtype: torch.dtype) -> FrameTalkerParts | None:
        """None when the family's talker makes one code per step from the thinker's vectors (the engine's talker
        runner drives ``ckpt.talker``); else the parts of a talker that makes frames of several codebooks
        (:mod:`pipeline.models.frame_talker`) on ``device`` in ``dtype``."""
        ...

    def thinker_parts(self, ckpt: Any, *, device: torch.device, cuda_graphs: bool) -> ThinkerParts:
        """The thinker's decoder stack, vocabulary head, user-audio encoder and vision tower (None without one) on
        ``device`` (the audio encoder's graphs only with ``cuda_graphs`` on CUDA)."""
        ...

    def vision_info(self, ckpt: Any) -> VisionInfo | None:
        """What the checkpoint's vision tower takes (pixel budget, patch sizes, video fps); None: it takes no
        pictures."""
        ...

    def av_timing(self, ckpt: Any) -> Any:
        """None when :meth:`vision_info` is None; else the time constants of audio in video
        (:class:`pipeline.models.qwen2_5_omni.av_interleave.AVTiming`: rotary positions per second, seconds per
        chunk, seconds per temporal patch at :attr:`VisionInfo.fps`), for camera video interleaved with speech."""
        ...

    def vision_preprocessor(self, ckpt: Any) -> Any:
        """None when :meth:`vision_info` is None; else a callable ``(frames, *, info=None) -> (pixel_values,
        grid_thw)``: uint8 RGB ``(H, W, 3)`` frames (one picture, or video frames in time order) to the vision tower's
        input, resized by ``info`` (default :meth:`vision_info`), raising ``InvalidImageError`` for a bad frame (the
        interface of :class:`pipeline.models.qwen2_5_omni.vision.VisionPreprocessor`). Runs on any thread."""
        ...

    def token2wav(self, ckpt: Any, stage: Any) -> Any:
        """The streaming synthesizer (see the module docstring) set up as ``stage`` says: the resolved
        ``stages.token2wav`` config (:class:`pipeline.config.Token2WavConfig`; not imported here: the config reads the
        family registry, never the other way)."""
        ...

    def start_stream(
        self, synthesizer: Any, ckpt: Any, voice: str, *, generator: torch.Generator | None, max_codes: int, quick: bool
    ) -> Any:
        """Open ``synthesizer``'s stream of one utterance in ``voice`` of at most ``max_codes`` codes; its noise (if
        any) drawn from ``generator``; ``quick``: the stream starts with the quick first chunk."""
        ...
