"""A conversation as the engine thread holds it: items, their token rendering, and the thinker KV
cache that mirrors a prefix of that rendering.

The cache lives in a KV slot of the thinker's pool (``slot``); its logical length is ``len(cached_keys)``. It is
kept consistent by one rule: before any prefill, the conversation is rendered to a list of per-position *keys* (the
token id for text, ``(item_id, block, version, i)`` for audio positions), the longest common prefix with the keys
already in the cache is kept, the cache is cropped to it and only the rest is prefilled. Deleting or truncating an
item, dropping the oldest turns to fit the context (:meth:`ConversationState.make_room`), changing the instructions or
cancelling a reply therefore rolls the cache back exactly as far as needed and never further, and history is never
prefilled twice.

For the talker the state keeps, per cached position, its talker input vector (what the family's ``thinker -> talker``
connector makes of it); an engine without a talker keeps none.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from pipeline.api import ROOT_ITEM_ID, ContextPolicy
from pipeline.core.cached_rope import CachedRope
from pipeline.errors import ContextLimitError, InvalidInputError, ResponseActiveError, UnknownItemError
from pipeline.models.positions import GridSpan
from pipeline.models.rendering import PromptRenderer
from pipeline.tools import Tool
from pipeline.video.message import OpenVideo, VideoPart


class ItemKind(enum.Enum):
    TEXT = "text"
    AUDIO = "audio"
    REPLY = "reply"
    FUNCTION_CALL = "function_call"
    """An assistant's call: ``reply_ids`` are its tokens (the model's own, or the family's rendering of a call the
    client added); it continues the assistant turn of the items before it."""
    CONTENT = "content"
    """A user message of text and images (``parts``)."""
    FUNCTION_OUTPUT = "function_output"
    """A tool's result (``text``), in the user turn of tool responses that consecutive outputs share."""


@dataclass
class AudioBlock:
    """Audio-encoder output for one 2 s block of a user audio message (or its final tail)."""

    embeds: torch.Tensor
    """(n_tokens, H) on the thinker device: 50 tokens for a full block."""
    version: int = 0
    """Bumped when the block is re-encoded (its features changed at commit), so its cache keys change."""
    floor: float | None = None
    """The log-mel floor its features were computed with (None: the final floor)."""
    error: Exception | None = None
    """Why its encode failed (pipeline/runners/audio_encodes.py); a response reading it fails with it."""


@dataclass
class ImageBlock:
    """Vision-tower output for one image of a message."""

    embeds: torch.Tensor
    """(n_tokens, H) on the thinker device (filled by the step's image encodes before anything renders)."""
    offsets: np.ndarray
    """(3, n_tokens) TMRoPE offsets (time, row, column) of its tokens from its first position."""
    deepstack: tuple[torch.Tensor, ...] = ()
    """Per-layer features added at its positions: the ``k``-th (n_tokens, H) to decoder layer ``k``'s output (filled
    with ``embeds``; empty for a vision tower without them, :class:`pipeline.models.family.LayeredVision`)."""
    error: Exception | None = None
    """Why its preprocessing or encode failed; a response reading it fails with it."""
    ready: bool = True
    """Its preprocessing and encode are done (failed: ``error``), on the device too, and ``embeds`` and ``deepstack``
    may be read by the engine's stream. Set by the engine thread at the start of a step
    (:meth:`pipeline.runners.image_encodes.ImageEncodes.flush`); no prefill reads a block before (see
    :attr:`Rendering.ready_until`)."""


class AudioFeatures(Protocol):
    """The incremental features of one spoken message (``ModelFamily.audio_features``; 16 kHz mono float32 in), as
    :class:`pipeline.core.conversations.Conversations` calls them: any number of :meth:`append` with the blocks
    ready so far encoded under :attr:`running_floor`, then :meth:`finish` once, after which :attr:`total_frames`,
    :meth:`raw_tail`, :meth:`final_floor` and :meth:`block_changes` may be read."""

    @property
    def sampling_rate(self) -> int: ...

    @property
    def samples_received(self) -> int: ...

    @property
    def running_floor(self) -> float:
        """The floor to encode a block with now."""
        ...

    @property
    def total_frames(self) -> int:
        """Frames of the final features (only after :meth:`finish`)."""
        ...

    def append(self, pcm: np.ndarray) -> None:
        """Add samples; ``InvalidAudioError`` for bad audio."""
        ...

    def ready_blocks(self) -> int:
        """How many leading blocks can be computed now with their final values."""
        ...

    def raw_block(self, k: int) -> np.ndarray:
        """Block ``k``'s raw features, before a floor."""
        ...

    def features(self, raw: np.ndarray, floor: float) -> torch.Tensor:
        """The encoder's input of ``raw`` under ``floor``."""
        ...

    def finish(self) -> None:
        """No more audio; idempotent."""
        ...

    def raw_tail(self) -> np.ndarray:
        """The raw features after the last complete block."""
        ...

    def final_floor(self) -> float:
        """The floor of the whole message."""
        ...

    def block_changes(self, k: int, floor_used: float) -> bool:
        """Whether block ``k``'s features under ``floor_used`` differ from those under :meth:`final_floor`."""
        ...


@dataclass
class OpenAudio:
    """A user audio message still being spoken: not in the conversation yet (it joins at commit),
    but its complete blocks are encoded, and prefilled when it would extend the cached context."""

    id: str
    features: AudioFeatures
    """The features of the samples so far."""
    blocks: list[AudioBlock] = field(default_factory=list)
    error: Exception | None = None
    """First failure while encoding in the background; raised at commit."""
    video: OpenVideo | None = None
    """Its camera video, from its first frame on (:mod:`pipeline.video.message`)."""


@dataclass
class ConvItem:
    id: str
    role: str
    kind: ItemKind
    text: str = ""
    audio_blocks: list[AudioBlock] = field(default_factory=list)
    """AUDIO: encoder outputs, block by block."""
    reply_ids: list[int] = field(default_factory=list)
    """REPLY: generated thinker tokens (the final eos excluded)."""
    open: bool = False
    """REPLY: still being generated (rendered without its closing footer)."""
    generated: bool = False
    """FUNCTION_CALL: ``reply_ids`` are the model's own tokens (with whatever it wrote between two calls)."""
    audio_ms: float = 0.0
    """REPLY: milliseconds of audio produced for it."""
    text_tokens: int = 0
    parts: list[str | ImageBlock] = field(default_factory=list)
    """CONTENT: text and images, in order."""
    video: VideoPart | None = None
    """AUDIO: its camera video (None: none, or removed by the video budget), interleaved with the audio."""


def function_item_tokens(renderer, item: ConvItem, prev: ConvItem | None, nxt: ConvItem | None) -> list[int]:
    """A function call's or tool output's positions, by its neighbours: a call continues the assistant turn before it
    (a call the client added is preceded by the family's separator unless it opens the turn or follows the assistant's
    text, which carries it), and the turn's footer follows the last call; tool outputs in a row share one user turn."""
    tools = renderer.tools
    kind = item.kind
    same_next = nxt is not None and nxt.kind is kind
    if kind is ItemKind.FUNCTION_CALL:
        prev_kind = prev.kind if prev is not None else None
        continues = prev is not None and prev.role == "assistant" and prev_kind is not ItemKind.AUDIO
        ids = list(item.reply_ids)
        if continues and not item.generated and prev_kind is not ItemKind.TEXT:
            ids = tools.call_separator() + ids
        head = [] if continues else renderer.header("assistant")
        return head + ids + ([] if same_next else renderer.footer())
    first = prev is None or prev.kind is not ItemKind.FUNCTION_OUTPUT
    text = tools.response_text(item.text, first=first, more=same_next)
    ids = renderer.open_message("user", text) if first else renderer.text(text)
    return ids + ([] if same_next else renderer.footer())


@dataclass
class Rendering:
    keys: list[Hashable]
    token_ids: list[int]
    audio: dict[int, tuple[torch.Tensor, int]]
    """position -> (encoder output, row) for audio and image placeholder positions."""
    spans: list[GridSpan] = field(default_factory=list)
    """Positions with explicit TMRoPE positions (images), in order."""
    image_tokens: int = 0
    """How many of ``audio``'s positions are image positions."""
    deepstack: dict[int, tuple[tuple[torch.Tensor, ...], int]] = field(default_factory=dict)
    """position -> (its block's :attr:`ImageBlock.deepstack`, row) for image and video positions whose vision tower
    makes per-layer features."""
    ready_until: int | None = None
    """The first position of a picture or frame pair whose block is not :attr:`~ImageBlock.ready` (None: every one
    is): a prefill chunk that would reach it waits (:meth:`pipeline.scheduler.prefill_plan.PrefillPlanner.chunk`)."""


class ConversationState:
    def __init__(self, conv_id: str, renderer: PromptRenderer, *, instructions: str, max_context_tokens: int):
        self.id = conv_id
        self.renderer = renderer
        self.instructions = instructions
        self.tools: tuple[Tool, ...] = ()
        """Function tools offered to the model: rendered into the system message by the family's ``tools`` format."""
        self.max_context_tokens = max_context_tokens
        self.items: list[ConvItem] = []
        self.policy: ContextPolicy | None = None
        """The conversation's own context policy (None: the engine's)."""
        self.dropped: set[str] = set()
        """Ids of the items :meth:`make_room` dropped to fit the context: deleting or truncating one does nothing
        (its owner may still show it; the model no longer sees it)."""
        self.open_audio: dict[str, OpenAudio] = {}
        self.active_response: str | None = None
        self.talker_slot: int | None = None
        """The talker KV slot holding this conversation's talker prompt (reused across turns)."""
        self.talker_keys: list[Hashable] = []
        """Keys of the prompt positions held in the talker slot, its first ``len(talker_keys)`` positions."""
        self.dirty = True
        """The rendering may extend beyond the cache: the engine prefills in the background."""
        self.slot: int | None = None
        """The thinker KV slot holding the first ``len(cached_keys)`` positions of the rendering."""
        self.cached_keys: list[Hashable] = []
        self.rope_shift = 0
        """Rope position - cache index of text after the cached prefix (0 without pictures): what a decode step adds
        on every TMRoPE axis. Set by each prefill chunk that ends outside a picture."""
        self.talker_vectors: list[torch.Tensor] = []
        """Chunks of (T, H) talker input vectors, together aligned with ``cached_keys`` (always empty in an engine
        without a talker)."""
        self.cached_rope = CachedRope()
        """The rope positions the cached positions were run at (the talker runs its prompt at the same)."""
        self.cached_spans: list[GridSpan] = []
        """The rendering's explicit-position spans that start among the cached positions, in order (a span the cache
        holds only the first positions of is kept whole): a frame talker places the ones it reads on its own
        sequence."""

    # -- items --------------------------------------------------------------------------------
    def held_slot(self) -> int:
        """The thinker slot, which a conversation in a prefill or decode batch always holds; RuntimeError (a bug)
        without one."""
        if self.slot is None:
            raise RuntimeError(f"conversation {self.id} holds no thinker slot")
        return self.slot

    def held_talker_slot(self) -> int:
        """The talker slot, which a conversation whose reply's talker runs always holds; RuntimeError (a bug)
        without one."""
        if self.talker_slot is None:
            raise RuntimeError(f"conversation {self.id} holds no talker slot")
        return self.talker_slot

    def find(self, item_id: str) -> ConvItem:
        for item in self.items:
            if item.id == item_id:
                return item
        raise UnknownItemError(f"no conversation item with id {item_id!r}", param="item_id")

    def has_item(self, item_id: str) -> bool:
        return item_id in self.open_audio or any(item.id == item_id for item in self.items)

    def audio_error(self) -> Exception | None:
        """The first failed encode among the conversation's audio blocks (committed or still being spoken) and
        images."""
        blocks: list[AudioBlock | ImageBlock] = [
            b for item in self.items if item.kind is ItemKind.AUDIO for b in item.audio_blocks
        ]
        blocks += [b for pending in self.open_audio.values() for b in pending.blocks]
        blocks += [b for item in self.items if item.video is not None for b in item.video.pairs]
        blocks += [b for p in self.open_audio.values() if p.video is not None for b in p.video.part.pairs]
        contents = [item for item in self.items if item.kind is ItemKind.CONTENT]
        blocks += [p for item in contents for p in item.parts if not isinstance(p, str)]
        return next((b.error for b in blocks if b.error is not None), None)

    def add(self, item: ConvItem, previous_item_id: str | None = None) -> None:
        """Append ``item`` (``previous_item_id`` None) or insert it right after ``previous_item_id``
        (:data:`~pipeline.api.ROOT_ITEM_ID`: first). The cache is not touched here: the next prefill keeps its common
        prefix with the new rendering (everything before the inserted item) and prefills the rest."""
        self.items.insert(self.place(item.id, previous_item_id), item)
        self.dirty = True

    def place(self, item_id: str, previous_item_id: str | None) -> int:
        """The index :meth:`add` gives a new item ``item_id``, or what it raises: the id is taken or reserved, the
        previous item is unknown, or the item would go before the end while a response runs. An item
        :meth:`make_room` dropped counts as being before every kept item (so an item after it goes first)."""
        if item_id == ROOT_ITEM_ID:
            raise InvalidInputError(f"{ROOT_ITEM_ID!r} is reserved and cannot be an item id", param="item_id")
        if self.has_item(item_id):
            raise InvalidInputError(f"item id {item_id!r} already exists", param="item_id")
        if previous_item_id is None:
            return len(self.items)
        index = next((k + 1 for k, item in enumerate(self.items) if item.id == previous_item_id), None)
        if previous_item_id == ROOT_ITEM_ID or previous_item_id in self.dropped and index is None:
            index = 0
        if index is None:
            raise UnknownItemError(f"no conversation item with id {previous_item_id!r}", param="previous_item_id")
        if index < len(self.items):
            self._require_idle("insert an item before the end of the conversation", param="previous_item_id")
        return index

    def delete(self, item_id: str) -> None:
        self._require_idle("delete an item")
        if item_id in self.dropped and not self.has_item(item_id):
            self.dropped.discard(item_id)
            return
        self.items.remove(self.find(item_id))
        self.dirty = True

    def truncate_reply(self, item_id: str, audio_end_ms: int) -> None:
        """Keep the share of the reply's text that was spoken by ``audio_end_ms``."""
        self._require_idle("truncate an item")
        if item_id in self.dropped and not self.has_item(item_id):
            return  # the model no longer sees it
        item = self.find(item_id)
        if item.kind is not ItemKind.REPLY:
            raise InvalidInputError("only assistant replies with audio can be truncated", param="item_id")
        if item.audio_ms <= 0 or audio_end_ms >= item.audio_ms:
            return
        keep = int(len(item.reply_ids) * max(audio_end_ms, 0) / item.audio_ms)
        item.reply_ids = item.reply_ids[:keep]
        item.audio_ms = float(max(audio_end_ms, 0))
        self.dirty = True

    def _require_idle(self, what: str, param: str = "item_id") -> None:
        if self.active_response is not None:
            raise ResponseActiveError(f"cannot {what} while a response is in progress", param=param)

    # -- rendering ----------------------------------------------------------------------------
    def render(self, *, with_open_audio: bool = False) -> Rendering:
        """The conversation's token layout. ``with_open_audio`` appends the first message still
        being spoken, as far as it is encoded (a prefix of its rendering once committed)."""
        r = Rendering(keys=[], token_ids=[], audio={})
        self._append_tokens(r, self.system_message())
        for k, item in enumerate(self.items):
            self._render_item(r, item, *self._neighbours(k))
        if with_open_audio and self.open_audio:
            pending = next(iter(self.open_audio.values()))
            video = pending.video
            if video is not None and video.timeline.has_video:
                closed = video.closed
                self._render_av(r, pending.id, "user", pending.blocks, video.part, closed=False, video_closed=closed)
            else:
                self._render_audio(r, pending.id, "user", pending.blocks, closed=False)
        return r

    def system_message(self) -> list[int]:
        """The instructions, with the tools block when the conversation offers tools."""
        content = self.instructions
        if self.tools:
            tool_format = self.renderer.tools
            assert tool_format is not None, "Conversations.set_tools takes tools only with the family's call format"
            content = tool_format.system_text(self.instructions, self.tools)
        return self.renderer.text_message("system", content)

    def _neighbours(self, k: int) -> tuple[ConvItem | None, ConvItem | None]:
        return (self.items[k - 1] if k else None, self.items[k + 1] if k + 1 < len(self.items) else None)

    def _render_item(self, r: Rendering, item: ConvItem, prev: ConvItem | None, nxt: ConvItem | None) -> None:
        """One item's positions. A function call continues the assistant turn of the items before it (their footer
        moves after it); consecutive tool outputs share one user turn (:func:`function_item_tokens`)."""
        call_next = nxt is not None and nxt.kind is ItemKind.FUNCTION_CALL
        if item.kind in (ItemKind.FUNCTION_CALL, ItemKind.FUNCTION_OUTPUT):
            self._append_tokens(r, function_item_tokens(self.renderer, item, prev, nxt))
        elif item.kind is ItemKind.TEXT and item.role == "assistant" and call_next:
            self._append_tokens(r, self.renderer.open_message(item.role, item.text + "\n"))
        elif item.kind is ItemKind.TEXT:
            self._append_tokens(r, self.renderer.text_message(item.role, item.text))
        elif item.kind is ItemKind.AUDIO and item.video is not None:
            self._render_av(r, item.id, item.role, item.audio_blocks, item.video, closed=True, video_closed=True)
        elif item.kind is ItemKind.AUDIO:
            self._render_audio(r, item.id, item.role, item.audio_blocks, closed=True)
        elif item.kind is ItemKind.CONTENT:
            self._render_content(r, item)
        else:
            self._append_tokens(r, self.renderer.header(item.role) + item.reply_ids)
            if not item.open and not call_next:
                self._append_tokens(r, self.renderer.footer())

    def _render_audio(self, r: Rendering, item_id: str, role: str, blocks: list[AudioBlock], *, closed: bool) -> None:
        s = self.renderer.special
        self._append_tokens(r, self.renderer.header(role) + [s.audio_start])
        for b, block in enumerate(blocks):
            for i in range(block.embeds.shape[0]):
                r.audio[len(r.keys)] = (block.embeds, i)
                r.keys.append((item_id, b, block.version, i))
                r.token_ids.append(s.audio_token)
        if closed:
            self._append_tokens(r, [s.audio_end] + self.renderer.footer())

    def _render_av(
        self,
        r: Rendering,
        item_id: str,
        role: str,
        blocks: list[AudioBlock],
        video: VideoPart,
        *,
        closed: bool,
        video_closed: bool,
    ) -> None:
        """A spoken message with video, in the family's layout of audio in video (one :class:`GridSpan` from its
        opening markers on; :class:`pipeline.models.positions.AVLayout`). Open (``closed`` False): only
        the chunks already final, without the closing markers, so each open rendering is a prefix of the next."""
        s = self.renderer.special
        audio = [(b, i) for b, block in enumerate(blocks) for i in range(block.embeds.shape[0])]
        layout = video.layout(len(audio))
        n = layout.n_chunks if closed else layout.ready_chunks(video_closed=video_closed, audio_closed=False)
        per_pair = video.rows * video.cols
        self._append_tokens(r, self.renderer.header(role))
        at = len(r.keys)
        self._append_tokens(r, [s.vision_start, s.audio_start])
        for j in range(n):
            chunk = layout.chunk(j)
            for v in chunk.video:
                pair, i = divmod(v, per_pair)
                self._place_vision(r, video.pairs[pair], i)
                r.keys.append((item_id, "video", pair, i))
                r.token_ids.append(s.video_token)
            for a in chunk.audio:
                b, i = audio[a]
                r.audio[len(r.keys)] = (blocks[b].embeds, i)
                r.keys.append((item_id, b, blocks[b].version, i))
                r.token_ids.append(s.audio_token)
            r.image_tokens += len(chunk.video)
        if closed:
            r.spans.append(GridSpan(at=at, offsets=layout.offsets(), advance=layout.advance))
            self._append_tokens(r, [s.audio_end, s.vision_end] + self.renderer.footer())
        else:
            r.spans.append(GridSpan(at=at, offsets=layout.prefix_offsets(n)))

    def _render_content(self, r: Rendering, item: ConvItem) -> None:
        """Text and images; an image's positions get its explicit TMRoPE offsets (a :class:`GridSpan`)."""
        images = [p for p in item.parts if not isinstance(p, str)]
        parts = [p if isinstance(p, str) else p.embeds.shape[0] for p in item.parts]
        k = 0
        for segment in self.renderer.content_message(item.role, parts):
            if isinstance(segment, list):
                self._append_tokens(r, segment)
                continue
            block = images[k]
            r.spans.append(GridSpan(at=len(r.keys), offsets=block.offsets))
            for i in range(segment):
                self._place_vision(r, block, i)
                r.keys.append((item.id, "image", k, i))
                r.token_ids.append(self.renderer.special.image_token)
            r.image_tokens += segment
            k += 1

    @staticmethod
    def _place_vision(r: Rendering, block: ImageBlock, i: int) -> None:
        """Row ``i`` of a picture's (or a video frame pair's) block at the next position."""
        if not block.ready and r.ready_until is None:
            r.ready_until = len(r.keys)
        r.audio[len(r.keys)] = (block.embeds, i)
        if block.deepstack:
            r.deepstack[len(r.keys)] = (block.deepstack, i)

    @staticmethod
    def _append_tokens(r: Rendering, ids: list[int]) -> None:
        r.keys.extend(ids)
        r.token_ids.extend(ids)

    # -- cache bookkeeping ----------------------------------------------------------------------
    def common_prefix(self, keys: list[Hashable]) -> int:
        return self.common_prefix_of(self.cached_keys, keys)

    @staticmethod
    def common_prefix_of(a: list[Hashable], b: list[Hashable]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    def crop(self, length: int) -> None:
        """Roll the KV cache and talker vectors back to the first ``length`` positions (the slot keeps its
        data; positions past the logical length are overwritten by the next prefill)."""
        if length >= len(self.cached_keys):
            return
        self.cached_keys = self.cached_keys[:length]
        self.cached_spans = [span for span in self.cached_spans if span.at < length]
        # the shift after the kept prefix is set again by the prefill that follows every crop
        vectors = torch.cat(self.talker_vectors) if self.talker_vectors else None
        self.talker_vectors = [vectors[:length]] if vectors is not None and length else []

    def extend(
        self,
        keys: list[Hashable],
        vectors: torch.Tensor | None,
        *,
        rope: np.ndarray | None = None,
        shift: int = 0,
        spans: list[GridSpan] | tuple[GridSpan, ...] = (),
    ) -> None:
        """Append positions run at rope positions ``rope`` (3, len(keys)), or at cache index + ``shift`` on every
        axis without it, with their talker vectors (None: the engine has no talker; it never passes vectors).
        ``spans``: the rendering's spans that hold some of them (each replaces a kept span that starts where it does:
        an open message's span grows from one rendering to the next)."""
        self.cached_rope.record(len(self.cached_keys), len(keys), rope, shift)
        if spans:
            starts = {span.at for span in spans}
            kept = [span for span in self.cached_spans if span.at not in starts]
            self.cached_spans = sorted([*kept, *spans], key=lambda span: span.at)
        self.cached_keys.extend(keys)
        if vectors is not None:
            self.talker_vectors.append(vectors)

    def talker_prompt(self) -> torch.Tensor:
        vectors = torch.cat(self.talker_vectors)
        self.talker_vectors = [vectors]
        return vectors

    def make_room(
        self,
        reply_budget: int,
        *,
        drop_oldest: bool,
        retention_ratio: float = 1.0,
        max_history_tokens: int | None = None,
    ) -> None:
        """Ensure the prompt plus ``reply_budget`` tokens fits ``max_context_tokens`` and, with
        ``max_history_tokens``, that the items after the instructions take at most that many positions.

        When it does not and ``drop_oldest``: the oldest items are dropped, whole turns at a time (the kept history
        starts with an item that is not the assistant's), until the prompt takes at most ``retention_ratio`` of the
        room (``max_context_tokens - reply_budget``, or the instructions plus ``max_history_tokens`` when that is
        less). The instructions and the turn being answered (:meth:`turn_start`) are never dropped. The next prefill
        keeps the cache's common prefix (the instructions) and prefills the rest again. Dropped ids go to
        :attr:`dropped`.

        Raises ContextLimitError, having dropped nothing, when the prompt does not fit: without ``drop_oldest``, or
        when the instructions and the turn being answered alone do not fit."""
        head, lengths = self._rendered_lengths()
        prompt, room = head + sum(lengths), self.max_context_tokens - reply_budget
        history_limited = False
        if max_history_tokens is not None and head + max_history_tokens < room:
            room, history_limited = head + max_history_tokens, True
        if prompt <= room:
            return
        if not drop_oldest:
            raise ContextLimitError(
                f"conversation has {prompt - head} tokens after the instructions, more than its limit of "
                f"{max_history_tokens} (delete items or start a new conversation)"
                if history_limited
                else f"conversation has {prompt} tokens; with up to {reply_budget} reply tokens it exceeds the context "
                f"limit of {self.max_context_tokens} tokens (delete items or start a new conversation)",
                param="max_output_tokens",
            )
        first_kept = self.turn_start()
        turn = sum(lengths[first_kept:])
        if head + turn > room:
            raise ContextLimitError(
                f"the input being answered ({turn} tokens) exceeds the conversation's limit of {max_history_tokens} "
                "tokens after the instructions (send a shorter input)"
                if history_limited
                else f"the instructions ({head} tokens) and the input being answered ({turn} tokens) with up to "
                f"{reply_budget} reply tokens exceed the context limit of {self.max_context_tokens} tokens "
                "(send a shorter input, shorter instructions or a smaller max_output_tokens)",
                param="max_output_tokens",
            )
        target, dropped = int(retention_ratio * room), 0
        while dropped < first_kept and (prompt > target or self.items[dropped].role == "assistant"):
            prompt -= lengths[dropped]
            dropped += 1
        self.dropped.update(item.id for item in self.items[:dropped])
        del self.items[:dropped]
        self.dirty = True

    def turn_start(self) -> int:
        """Index of the first item of the turn being answered: the first item after the last finished assistant
        item (0 when there is none)."""
        for k in range(len(self.items) - 1, -1, -1):
            if self.items[k].role == "assistant" and not self.items[k].open:
                return k + 1
        return 0

    def _rendered_lengths(self) -> tuple[int, list[int]]:
        """Positions of the instructions and of each item in :meth:`render` (which concatenates them)."""
        head = Rendering(keys=[], token_ids=[], audio={})
        self._append_tokens(head, self.system_message())
        lengths = []
        for k, item in enumerate(self.items):
            r = Rendering(keys=[], token_ids=[], audio={})
            self._render_item(r, item, *self._neighbours(k))
            lengths.append(len(r.keys))
        return len(head.keys), lengths

    def crop_talker(self, length: int) -> None:
        """Keep only the first ``length`` prompt positions of the talker cache."""
        self.talker_keys = self.talker_keys[:length]

    def free(self) -> None:
        """Forget every cached position (they are rebuilt from the items on the next prefill). The slots stay
        assigned; the scheduler releases them (:meth:`pipeline.scheduler.kv_slots.KVSlots.release`)."""
        self.cached_keys = []
        self.rope_shift = 0
        self.talker_vectors = []
        self.cached_rope.clear()
        self.cached_spans = []
        self.talker_keys = []
