"""Requests on conversations: items, instructions and user audio as it streams in.

:class:`Conversations` applies the conversation requests of :mod:`pipeline.core.commands` to the
:class:`~pipeline.core.conversation_state.ConversationState` of the scheduler's registry (opened and closed through the
scheduler's methods). User audio is turned into features as it arrives and each
complete 2 s block is queued for the next step's audio encode, so that the thinker prefills a message while it is
still being spoken. Engine thread only, between two steps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from pipeline.api import ContextPolicy, VisionInfo
from pipeline.core.conversation_state import (
    AudioBlock,
    AudioFeatures,
    ConversationState,
    ConvItem,
    ImageBlock,
    ItemKind,
    OpenAudio,
)
from pipeline.errors import (
    EmptyInputError,
    InvalidAudioError,
    InvalidImageError,
    InvalidInputError,
    UnknownItemError,
    UnsupportedInputError,
)
from pipeline.models.positions import AVTiming
from pipeline.runners.image_encodes import ImageEncodes
from pipeline.scheduler.scheduler import Scheduler
from pipeline.tools import Tool
from pipeline.video.message import OpenVideo

__all__ = ["MIN_AUDIO_FRAMES", "Conversations"]

log = logging.getLogger("pipeline.core.engine_core")

MIN_AUDIO_FRAMES = 2
"""Shortest audio message the encoder accepts (mel frames of 10 ms)."""


class Conversations:
    def __init__(
        self,
        scheduler: Scheduler,
        *,
        renderer,
        max_context: int,
        features: Callable[[], AudioFeatures],
        audio_encodes,
        exact_floor: bool,
        end_response: Callable[[str], None],
        image_encodes: ImageEncodes | None = None,
        vision_info: VisionInfo | None = None,
        av_timing: AVTiming | None = None,
        video_grace_s: float = 2.0,
    ) -> None:
        self.scheduler = scheduler
        self.renderer = renderer
        self.max_context = max_context
        self.features = features
        """Makes the incremental log-mel features of one message (the model family's)."""
        self.audio_encodes = audio_encodes
        self.image_encodes = image_encodes
        """Checks pictures and camera frame pairs and queues their preprocessing and vision encode off the engine
        thread (:class:`~pipeline.runners.image_encodes.ImageEncodes`; None: the checkpoint takes no pictures)."""
        self.vision_info = vision_info
        """What the vision tower takes (None: no vision tower)."""
        self.av_timing = av_timing
        """The model's time constants for audio in video (None: no vision tower)."""
        self.video_grace_s = video_grace_s
        """``thinker.video_frame_grace_seconds`` (:class:`~pipeline.video.timeline.VideoTimeline`)."""
        self.frames_dropped = 0
        """Camera frames dropped by the rules of :mod:`pipeline.video.message` since start (counted at commit or
        discard of their message)."""
        self.exact_floor = exact_floor
        """``audio_floor: exact``: re-encode, at commit, the blocks whose features the final loudness changed."""
        self.end_response = end_response
        """Ends a live response as ``cancelled`` (its conversation is closing)."""

    def get(self, conv_id: str) -> ConversationState:
        try:
            return self.scheduler.conversations[conv_id]
        except KeyError:
            raise InvalidInputError(f"conversation {conv_id!r} is closed", param="conversation") from None

    def open(self, conv_id: str, instructions: str) -> None:
        self.scheduler.open_conversation(
            ConversationState(conv_id, self.renderer, instructions=instructions, max_context_tokens=self.max_context)
        )

    def close(self, conv_id: str) -> None:
        """End the conversation's live response (``conversation_closed``), then forget it and free its KV slots."""
        conv = self.scheduler.conversations.get(conv_id)
        if conv is None:
            return
        active = conv.active_response
        if active is not None and active in self.scheduler.responses:
            self.end_response(active)
        self.scheduler.close_conversation(conv_id)

    def set_instructions(self, conv_id: str, instructions: str) -> None:
        conv = self.get(conv_id)
        conv._require_idle("change the instructions")
        conv.instructions = instructions
        conv.dirty = True

    def set_context_policy(self, conv_id: str, policy: ContextPolicy | None) -> None:
        if policy is not None:
            if not 0.0 <= policy.retention_ratio <= 1.0:
                raise InvalidInputError(
                    f"retention_ratio must be between 0 and 1, got {policy.retention_ratio}", param="retention_ratio"
                )
            if policy.max_history_tokens is not None and policy.max_history_tokens <= 0:
                raise InvalidInputError(
                    f"max_history_tokens must be positive, got {policy.max_history_tokens}", param="max_history_tokens"
                )
        self.get(conv_id).policy = policy

    def set_tools(self, conv_id: str, tools: tuple[Tool, ...]) -> None:
        """The function tools the model is offered (in the system message): the next prefill re-renders the prompt
        from the system message on."""
        conv = self.get(conv_id)
        conv._require_idle("change the tools")
        if tools:
            self._tool_format()
        conv.tools = tuple(tools)
        conv.dirty = True

    def add_function_call(self, conv_id: str, item_id: str, name: str, arguments: str) -> None:
        """A call of the assistant's that the client adds (history): rendered in the family's call format."""
        ids = self._tool_format().call(name, arguments)
        self.get(conv_id).add(ConvItem(id=item_id, role="assistant", kind=ItemKind.FUNCTION_CALL, reply_ids=ids))

    def add_function_output(self, conv_id: str, item_id: str, output: str) -> None:
        """A tool's result, for the model's next reply."""
        self._tool_format()
        self.get(conv_id).add(ConvItem(id=item_id, role="user", kind=ItemKind.FUNCTION_OUTPUT, text=output))

    def _tool_format(self):
        tools = getattr(self.renderer, "tools", None)
        if tools is None:
            raise InvalidInputError("this model has no function-calling format: tools are not available", param="tools")
        return tools

    def add_text(self, conv_id: str, item_id: str, role: str, text: str, previous_item_id: str | None = None) -> None:
        """A text message, appended or inserted after ``previous_item_id`` (:meth:`ConversationState.add`)."""
        if not text.strip():
            raise EmptyInputError("text message is empty", param="text")
        self.get(conv_id).add(ConvItem(id=item_id, role=role, kind=ItemKind.TEXT, text=text), previous_item_id)

    def add_content(self, conv_id: str, item_id: str, parts: tuple, previous_item_id: str | None = None) -> None:
        """A user message of text and pictures in order, placed as :meth:`add_text` places it; each picture is checked
        here and queued for its preprocessing and vision encode off the engine thread, then prefilled in the
        background once encoded. Every part is checked before anything is queued: a refused message leaves the
        conversation as it was."""
        conv = self.get(conv_id)
        encodes = self.image_encodes
        if encodes is None and any(not isinstance(part, str) for part in parts):
            raise UnsupportedInputError("this model has no vision tower: it cannot take images", param="content")
        conv.place(item_id, previous_item_id)
        if not parts or all(isinstance(part, str) and not part.strip() for part in parts):
            raise EmptyInputError("message has no text and no image", param="content")
        for k, part in enumerate(parts):
            if isinstance(part, np.ndarray):
                assert encodes is not None, "refused above"
                encodes.check([part])  # raises InvalidImageError for a bad picture
            elif not isinstance(part, str):
                raise InvalidImageError(
                    f"content part {k} must be text or a uint8 RGB (H, W, 3) array, got {type(part).__name__}",
                    param="content",
                )
        blocks: list[str | ImageBlock] = [
            part if isinstance(part, str) else self._images().picture([part]) for part in parts
        ]
        conv.add(ConvItem(id=item_id, role="user", kind=ItemKind.CONTENT, parts=blocks), previous_item_id)

    def append_audio(self, conv_id: str, item_id: str, pcm: np.ndarray) -> None:
        """Feed user audio (16 kHz float32) of a message still being spoken. Each complete 2 s block is queued for
        the next step's encode and prefilled in the background while the conversation is idle. An error is kept and
        raised at commit, where the caller waits."""
        conv = self.get(conv_id)
        pending = self._open(conv, item_id)
        if pending.error is not None:
            return
        try:
            pending.features.append(pcm)
            for k in range(len(pending.blocks), pending.features.ready_blocks()):
                pending.blocks.append(self._encode_block(pending.features, k, pending.features.running_floor))
                conv.dirty = True
            self._advance_video(conv, pending, closed=False)
        except Exception as exc:  # noqa: BLE001 - kept and raised at commit, where the caller waits
            log.exception("encoding audio of %s failed", item_id)
            pending.error = exc

    def _open(self, conv: ConversationState, item_id: str) -> OpenAudio:
        """The message ``item_id`` being spoken, opened by its first audio or frame."""
        pending = conv.open_audio.get(item_id)
        if pending is None:
            pending = conv.open_audio[item_id] = OpenAudio(item_id, self.features())
            if any(item.id == item_id for item in conv.items):
                pending.error = InvalidInputError(f"item id {item_id!r} already exists", param="item_id")
        return pending

    def add_video_frame(self, conv_id: str, item_id: str, frame: np.ndarray, t: float) -> None:
        """A camera frame of the message ``item_id`` being spoken, seen ``t`` seconds after its first audio sample
        (the handle checked the frame). Frame pairs that become final are queued for their preprocessing and vision
        encode off the engine thread; the chunks they complete are prefilled in the background once encoded. A frame
        the rules drop is counted (:mod:`pipeline.video.message`), and so is a frame that arrives while the
        preprocessing pool is full (:attr:`~pipeline.runners.image_encodes.ImageEncodes.has_room`: the timeline
        repeats the frame before it); an error is kept and raised at commit."""
        conv = self.get(conv_id)
        if self.image_encodes is None or self.vision_info is None or self.av_timing is None:
            raise UnsupportedInputError("this model has no vision tower: it cannot take video", param="video")
        pending = self._open(conv, item_id)
        if pending.error is not None:
            return
        if not self.image_encodes.has_room:
            self.frames_dropped += 1
            log.debug("camera frame of %s dropped: the picture preprocessing is full", item_id)
            return
        try:
            if pending.video is None:
                size = self.vision_info.resized(frame.shape[0], frame.shape[1])
                pending.video = OpenVideo(self.vision_info, self.av_timing, grace_s=self.video_grace_s, size=size)
            had_video = pending.video.timeline.has_video
            if pending.video.add(frame, t) and not had_video:
                conv.dirty = True  # the message is rendered as audio in video from now on
            self._advance_video(conv, pending, closed=False)
        except InvalidImageError as exc:  # a frame of extreme aspect ratio: dropped, the message carries on
            self.frames_dropped += 1
            log.warning("camera frame of %s dropped: %s", item_id, exc)
        except Exception as exc:  # noqa: BLE001 - kept and raised at commit, where the caller waits
            log.exception("adding a camera frame to %s failed", item_id)
            pending.error = exc

    def _advance_video(self, conv: ConversationState, pending: OpenAudio, *, closed: bool) -> None:
        """Queue the encodes of the message's frame pairs that became final (``closed``: at commit)."""
        video = pending.video
        if video is None:
            return
        audio_s = pending.features.samples_received / pending.features.sampling_rate
        if video.advance(audio_s, self._encode_pair, closed=closed):
            conv.dirty = True

    def _encode_pair(self, frames: list[np.ndarray]) -> ImageBlock:
        return self._images().picture(frames)

    def _images(self) -> ImageEncodes:
        """The image encodes; the callers check first that the checkpoint takes pictures."""
        if self.image_encodes is None:
            raise UnsupportedInputError("this model has no vision tower: it cannot take images", param="content")
        return self.image_encodes

    def commit_audio(self, conv_id: str, item_id: str, previous_item_id: str | None = None) -> None:
        """Close a spoken message: queue the tail's encode (and, with an exact floor, the re-encode of the blocks whose
        features the final loudness changed) for the next step, and add it to the conversation (appended, or after
        ``previous_item_id``)."""
        conv = self.get(conv_id)
        pending = conv.open_audio.pop(item_id, None)
        if pending is None:
            raise UnknownItemError(f"no audio message {item_id!r} is being recorded", param="item_id")
        conv.dirty = True  # whatever happens below, its prefilled positions must be re-synced
        if pending.error is not None:
            raise pending.error
        feats = pending.features
        feats.finish()
        if feats.total_frames < MIN_AUDIO_FRAMES:
            raise InvalidAudioError("audio message is too short to encode (needs at least 20 ms)", param="audio")
        final = feats.final_floor()
        if self.exact_floor:
            for k, block in enumerate(pending.blocks):
                # a block's floor is None only when it was encoded with the final floor: then it cannot change
                if block.floor is not None and feats.block_changes(k, block.floor):
                    pending.blocks[k] = self._encode_block(feats, k, final, version=block.version + 1)
        for k in range(len(pending.blocks), feats.ready_blocks()):  # completed by the end of the signal
            pending.blocks.append(self._encode_block(feats, k, final))
        tail = feats.raw_tail()
        if tail.shape[1]:
            pending.blocks.append(self.audio_encodes.block(feats.features(tail, final), floor=final))
        video = None
        if pending.video is not None:
            self._advance_video(conv, pending, closed=True)
            self.frames_dropped += pending.video.frames_dropped
            video = pending.video.part if pending.video.part.pairs else None
        item = ConvItem(id=item_id, role="user", kind=ItemKind.AUDIO, audio_blocks=pending.blocks, video=video)
        conv.add(item, previous_item_id)

    def _encode_block(self, feats: AudioFeatures, k: int, floor: float, version: int = 0) -> AudioBlock:
        return self.audio_encodes.block(feats.features(feats.raw_block(k), floor), floor=floor, version=version)

    def discard_audio(self, conv_id: str, item_id: str) -> None:
        conv = self.get(conv_id)
        pending = conv.open_audio.pop(item_id, None)
        if pending is not None:
            conv.dirty = True  # its prefilled positions are rolled back in the background
            if pending.video is not None:
                self.frames_dropped += pending.video.frames_dropped

    def add_audio(self, conv_id: str, item_id: str, pcm: np.ndarray, previous_item_id: str | None = None) -> None:
        """A whole audio message, placed as :meth:`add_text` places a text one."""
        conv = self.get(conv_id)
        if previous_item_id is not None:
            conv.place(item_id, previous_item_id)  # before any encode: a refused insertion leaves nothing behind
        self.append_audio(conv_id, item_id, pcm)
        self.commit_audio(conv_id, item_id, previous_item_id)

    def delete_item(self, conv_id: str, item_id: str) -> None:
        self.get(conv_id).delete(item_id)

    def truncate_item(self, conv_id: str, item_id: str, audio_end_ms: int) -> None:
        self.get(conv_id).truncate_reply(item_id, audio_end_ms)
