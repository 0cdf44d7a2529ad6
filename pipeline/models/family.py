"""What the engine needs from a model family: the one interface between the engine and a model's own code.

A family is a stateless object (one per family, listed in :mod:`pipeline.models`). Its loaders return a
*checkpoint*, an object of the family's own type that the engine treats as opaque except for four attributes:
``source`` (what was asked for: a folder or hub id, in words), ``random_weights`` (bool), and ``thinker`` /
``talker``, HF decoder-shaped modules that the engine's runners drive (``pipeline/runners/``). Everything else the
engine learns by handing the checkpoint back to the family's methods below, on the engine thread.

What the family's objects offer is typed by the protocols of the sibling modules: the prompt renderer, its special
ids and call format (:mod:`pipeline.models.rendering`), the rotary positions and the layout of audio in video
(:mod:`pipeline.models.positions`), the streaming synthesizer and its streams, with their calling order
(:mod:`pipeline.models.synthesis`). The engine reaches a family only through this protocol: no module outside a
family's folder imports the family (``tests/unit/test_imports.py``); code several families share lives in
:mod:`pipeline.models.common`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from pipeline.api import TranscriptionPrompt, VisionInfo
from pipeline.models.frame_talker import FrameTalkerParts
from pipeline.models.positions import AVTiming, PositionScheme
from pipeline.models.rendering import PromptRenderer, SpecialIds
from pipeline.models.synthesis import StreamingSynthesizer, StreamStatus, Token2WavStream

if TYPE_CHECKING:
    import torch

__all__ = ["Checkpoint", "Connector", "LayeredVision", "ModelFamily", "StreamStatus", "ThinkerParts"]


Checkpoint: TypeAlias = Any
"""A loaded checkpoint of some family: opaque to the engine but for ``source``, ``random_weights``, ``thinker`` and
``talker`` (see the module docstring)."""


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
    grid_thw)`` as :meth:`ModelFamily.vision_preprocessor` makes them, in order; several may run as one batch), each
    output either a (tokens, hidden) tensor (the item's input embeddings) or a :class:`LayeredVision`;
    ``tokens(grid_thw) -> int`` (thinker positions of an item of that grid); ``merge_size`` (the tower's spatial
    merge); ``deepstack_layers`` (how many :attr:`LayeredVision.deepstack` tensors each output carries; 0 when the
    outputs are plain tensors)."""


class LayeredVision(Protocol):
    """A vision tower's output for one item whose features also enter the decoder past its input: ``tokens`` (n, hidden)
    are the input embeddings of the item's ``n`` positions, and ``deepstack[k]`` (n, hidden) is added to the output of
    decoder layer ``k`` at the same positions, for ``k`` in ``range(len(deepstack))`` (Qwen3-Omni's deepstack)."""

    tokens: torch.Tensor
    deepstack: tuple[torch.Tensor, ...]


@runtime_checkable
class ModelFamily(Protocol):
    """A model family: how its checkpoints load and what its stages need around the runners."""

    name: str
    """The stage config's ``model_family``."""

    display_name: str
    """The family's name in words, for logs and reports (``Qwen2.5-Omni``)."""

    codes_per_second: float
    """Talker steps per second of audio in the released architecture: codec tokens (one code a step) or frames
    (several codebooks a step); used to state reply lengths in seconds."""

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

    token2wav_keys: frozenset[str]
    """The keys of the stage config's ``stages.token2wav`` section that are the family's own (its synthesizer's
    settings), beside the engine's (:class:`pipeline.config.Token2WavConfig`'s fields, which they never repeat); the
    config refuses any other key, naming both sets."""

    def token2wav_config(self, raw: Mapping[str, Any], *, path: str, device: torch.device) -> object:
        """The family's settings of the token2wav section: ``raw`` holds the section's keys of
        :attr:`token2wav_keys` as the YAML gives them (any subset; ``auto`` values allowed), the result holds them
        validated, defaults filled in and ``auto`` resolved for the stage's ``device``. Raises ``ConfigError`` whose
        ``param`` is ``{path}.{key}`` for a bad value. Called once per stage config, on the thread that reads it; the
        engine keeps the result in ``Token2WavConfig.settings`` and hands it to nothing but :meth:`token2wav`."""
        ...

    def resolve_checkpoint(self, model: str) -> Path:
        """The folder of checkpoint ``model`` (a folder, or a hub id already in the local cache), found without
        reading weights, so that a command line can check ``--model`` before loading; ``CheckpointError`` saying
        what is wrong otherwise. Never downloads."""
        ...

    def load_pretrained(
        self, model: str, *, devices: dict[str, torch.device | str], dtypes: dict[str, torch.dtype]
    ) -> Checkpoint:
        """The checkpoint of folder ``model``, or of hub id ``model`` already in the local cache (never downloads),
        validated, its stages placed as ``devices`` / ``dtypes`` (keyed by stage name) say. Raises
        ``CheckpointError`` naming the file or field that is missing or inconsistent."""
        ...

    random_presets: tuple[str, ...]
    """Names of the family's random-weight architectures (:meth:`random_spec`); ``tiny`` among them: the embedded
    model and the tests' model, seconds to build on a CPU."""

    def random_spec(self, preset: str, *, seed: int = 0) -> Any:
        """The architecture of random-weight preset ``preset`` (one of :attr:`random_presets`; ``KeyError``
        otherwise) with weight seed ``seed``: a frozen dataclass, equal for equal arguments, that
        :meth:`build_random` and :meth:`write_random` take."""
        ...

    def build_random(
        self, spec: Any, *, device: torch.device | str, dtype: torch.dtype, devices: dict[str, str] | None = None
    ) -> Checkpoint:
        """A checkpoint with random weights of the family's architecture ``spec`` (:meth:`random_spec`), built in
        memory on ``device``, then each stage's part moved to its device in ``devices`` (keyed by stage name; a stage
        not named stays on ``device``); ``random_weights`` is true."""
        ...

    def write_random(self, out_dir: Path, spec: Any) -> Path:
        """Write a checkpoint with random weights of ``spec`` into folder ``out_dir`` (made if missing) in the
        layout :meth:`load_pretrained` reads, marked as random, and return the folder. Offline and deterministic:
        the same spec and software write the same weights."""
        ...

    def random_checkpoint_command(self, argv: Sequence[str], *, prog: str) -> int:
        """The ``make-tiny-model`` command: parse ``argv`` (``prog``: the command's name in its help), write the
        random checkpoint it asks for (:meth:`random_spec`, :meth:`write_random`), say what was written; returns
        the exit status."""
        ...

    def max_context(self, ckpt: Checkpoint) -> int:
        """The thinker's longest context (positions) the checkpoint supports."""
        ...

    def special(self, ckpt: Checkpoint) -> SpecialIds:
        """The special ids the engine reads by name."""
        ...

    def codec_stop_ids(self, ckpt: Checkpoint) -> tuple[int, ...]:
        """Talker ids that end an utterance (the talker's sampler stops on them; never reach token2wav)."""
        ...

    def codec_suppress_ids(self, ckpt: Checkpoint) -> list[int]:
        """Talker ids the talker's sampler must never emit (ids token2wav cannot make audio of, except stop ids)."""
        ...

    def renderer(self, ckpt: Checkpoint) -> PromptRenderer:
        """The prompt renderer of the family's chat format, for the conversation state (its ``special`` are
        :meth:`special`'s)."""
        ...

    def positions(self, ckpt: Checkpoint) -> PositionScheme:
        """How the thinker's rotary positions follow from a rendering's explicit-position spans, and the offsets of
        a picture's positions, for the scheduler's prefills and the picture encodes."""
        ...

    def speaks(self, ckpt: Checkpoint) -> bool:
        """Whether the checkpoint makes audio (it has a talker and token2wav). False (a text-only checkpoint): the
        engine builds no talker and no token2wav and answers in text only; :meth:`voices` is empty, and the talker and
        synthesizer methods (:meth:`default_voice`, :meth:`voice_bos`, :meth:`codec_stop_ids`,
        :meth:`codec_suppress_ids`, :meth:`frame_talker_parts`, :meth:`token2wav`, :meth:`start_stream`) are never
        called."""
        ...

    def voices(self, ckpt: Checkpoint) -> tuple[str, ...]:
        """The voice names a reply may ask for (empty when the checkpoint does not :meth:`speak <speaks>`)."""
        ...

    def default_voice(self, ckpt: Checkpoint) -> str:
        """The voice of a reply that names none; one of :meth:`voices`."""
        ...

    def voice_bos(self, ckpt: Checkpoint, voice: str) -> int:
        """The thinker-vocabulary id that opens the talker's stream for ``voice`` (after the prompt)."""
        ...

    def audio_features(self, ckpt: Checkpoint) -> Any:
        """Incremental features of one spoken message for the thinker's audio encoder (16 kHz mono float32 in):
        ``append(pcm)``, ``ready_blocks()``, ``raw_block(k)`` / ``raw_tail()``, ``features(raw, floor)``,
        ``running_floor``, ``finish()``, ``total_frames``, ``final_floor()``, ``block_changes(k, floor)``,
        ``samples_received`` and ``sampling_rate``, as :class:`pipeline.core.conversations.Conversations` calls them."""
        ...

    def frame_talker_parts(
        self, ckpt: Checkpoint, *, device: torch.device, dtype: torch.dtype
    ) -> FrameTalkerParts | None:
        """None when the family's talker makes one code per step from the thinker's vectors (the engine's talker
        runner drives ``ckpt.talker``); else the parts of a talker that makes frames of several codebooks
        (:mod:`pipeline.models.frame_talker`) on ``device`` in ``dtype``."""
        ...

    def thinker_parts(self, ckpt: Checkpoint, *, device: torch.device, cuda_graphs: bool) -> ThinkerParts:
        """The thinker's decoder stack, vocabulary head, user-audio encoder and vision tower (None without one) on
        ``device`` (the audio encoder's graphs only with ``cuda_graphs`` on CUDA)."""
        ...

    def vision_info(self, ckpt: Checkpoint) -> VisionInfo | None:
        """What the checkpoint's vision tower takes (pixel budget, patch sizes, video fps); None: it takes no
        pictures."""
        ...

    def av_timing(self, ckpt: Checkpoint) -> AVTiming | None:
        """None when :meth:`vision_info` is None; else how a spoken message with camera video is laid out (its
        time constants from the checkpoint, seconds per temporal patch at :attr:`VisionInfo.fps`)."""
        ...

    def vision_preprocessor(self, ckpt: Checkpoint) -> Callable[..., tuple[Any, Any]] | None:
        """None when :meth:`vision_info` is None; else a callable ``(frames, *, info=None) -> (pixel_values,
        grid_thw)``: uint8 RGB ``(H, W, 3)`` frames (one picture, or video frames in time order) to the vision tower's
        input, resized by ``info`` (default :meth:`vision_info`), raising ``InvalidImageError`` for a bad frame. Runs
        on any thread."""
        ...

    def token2wav(self, ckpt: Checkpoint, stage: Any) -> StreamingSynthesizer:
        """The streaming synthesizer set up as ``stage`` says: the resolved ``stages.token2wav`` config
        (:class:`pipeline.config.Token2WavConfig`, its family settings :meth:`token2wav_config`'s; not imported here:
        the config reads the family registry, never the other way)."""
        ...

    def start_stream(
        self,
        synthesizer: StreamingSynthesizer,
        ckpt: Checkpoint,
        voice: str,
        *,
        generator: torch.Generator | None,
        max_codes: int,
        quick: bool,
    ) -> Token2WavStream:
        """Open ``synthesizer``'s stream of one utterance in ``voice`` of at most ``max_codes`` codes; its noise (if
        any) drawn from ``generator``; ``quick``: the stream starts with the quick first chunk."""
        ...
