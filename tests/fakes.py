"""A scripted fake of the engine seam (``pipeline.api``), for tests of everything above it.

:class:`FakeEngine` hands out :class:`FakeConversation` objects that record every call in
``calls`` (tuples such as ``("add_text", item_id, text, role)``) and enforce the seam's contract:
one response at a time, deletes/truncates/insertions before the end only while idle, unknown items
rejected, appends only before commit/discard. Each response plays a :class:`Script`: text deltas interleaved with audio
chunks, then ``ResponseDone``; pacing is free-running, delayed, or ``manual`` (each event waits for
:meth:`FakeResponse.release`), and ``events_after_cancel`` lets a cancelled response still deliver
some output, as a real engine does until its current step ends.

Also here: :class:`FakeTurnDetector` (scripted speech events, no model) and :class:`MemoryTransport`
(an in-memory client connection).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from pipeline.api import (
    INPUT_SAMPLE_RATE,
    ROOT_ITEM_ID,
    ContextPolicy,
    Modality,
    Role,
    TranscriptionPrompt,
    VisionInfo,
)
from pipeline.errors import (
    EngineClosedError,
    InvalidImageError,
    ResponseActiveError,
    UnknownItemError,
    UnknownVoiceError,
    UnsupportedInputError,
)
from pipeline.response_events import (
    OUTPUT_SAMPLE_RATE,
    AudioChunk,
    ResponseDone,
    ResponseEvent,
    ResponseStatus,
    TextDelta,
    Usage,
)
from pipeline.tools import AUTO, Tool, ToolChoice
from realtime.protocol.turn_detection import ServerVadParams
from realtime.runner import TransportClosed
from realtime.turns.server_vad import SpeechStarted, SpeechStopped

SAMPLES_PER_CODEC_TOKEN = OUTPUT_SAMPLE_RATE // 50  # 20 ms per talker codec token


@dataclass
class Script:
    """What one fake response produces.

    Events: ``text[0]``, audio chunk 0, ``text[1]``, audio chunk 1, … (leftovers of the longer
    list at the end); audio only when the response was asked for audio. Each chunk is a
    ``chunk_ms`` long 440 Hz tone at amplitude 0.1."""

    text: tuple[str, ...] = ("Hello", " there", "!")
    audio_chunks: int = 3
    chunk_ms: int = 40
    status: ResponseStatus = ResponseStatus.COMPLETED
    reason: str | None = None
    error: Exception | None = None
    delay_s: float = 0.0
    """Sleep before each event (free-running when 0, except for one yield to the loop)."""
    manual: bool = False
    """Each event (ResponseDone included) waits for ``FakeResponse.release``."""
    events_after_cancel: int = 0
    """Output events still yielded after ``cancel()`` before the cancelled ``ResponseDone``."""
    crash_after: int | None = None
    """Break the stream contract: raise ``RuntimeError`` after this many events."""

    def events(self, audio: bool) -> list[TextDelta | AudioChunk]:
        chunks = [self._chunk(i) for i in range(self.audio_chunks)] if audio else []
        deltas = [TextDelta(t, (i,)) for i, t in enumerate(self.text)]
        out: list[TextDelta | AudioChunk] = []
        for i in range(max(len(deltas), len(chunks))):
            out.extend(deltas[i : i + 1])
            out.extend(chunks[i : i + 1])
        return out

    def _chunk(self, index: int) -> AudioChunk:
        n = OUTPUT_SAMPLE_RATE * self.chunk_ms // 1000
        start = index * n
        t = (start + np.arange(n)) / OUTPUT_SAMPLE_RATE
        pcm = (0.1 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
        return AudioChunk(pcm, start)


class FakeResponse:
    """A :class:`pipeline.api.ResponseHandle` that plays a :class:`Script`."""

    def __init__(self, conversation: FakeConversation, item_id: str, modalities: frozenset[Modality], script: Script):
        self.id = f"fake_resp_{len(conversation.responses) + 1}"
        self.item_id = item_id
        self.modalities = modalities
        self.script = script
        self.cancel_reason: str | None = None
        self.done: ResponseDone | None = None
        self.yielded: list[ResponseEvent] = []
        self._conversation = conversation
        self._credits = asyncio.Semaphore(0)
        self._cancelled = asyncio.Event()

    def release(self, n: int = 1) -> None:
        """Manual pacing: let ``n`` more events through."""
        for _ in range(n):
            self._credits.release()

    def cancel(self, reason: str = "client_cancelled") -> None:
        if self.done is None and self.cancel_reason is None:
            self.cancel_reason = reason
            self._cancelled.set()

    async def wait(self) -> ResponseDone:
        async for _ in self:
            pass
        assert self.done is not None
        return self.done

    async def __aiter__(self) -> AsyncIterator[ResponseEvent]:
        if self.done is not None:
            return
        events = deque(self.script.events(audio="audio" in self.modalities))
        grace = self.script.events_after_cancel
        while events:
            await self._pace()
            if self.cancel_reason is not None:
                if grace == 0:
                    break
                grace -= 1
            if self.script.crash_after is not None and len(self.yielded) == self.script.crash_after:
                self._conversation._response_finished(self)
                raise RuntimeError("fake engine crashed")
            event = events.popleft()
            self.yielded.append(event)
            yield event
        if self.cancel_reason is None:
            await self._pace()
        yield self._finish()

    async def _pace(self) -> None:
        if self.script.manual and self.cancel_reason is None:
            credit = asyncio.ensure_future(self._credits.acquire())
            cancelled = asyncio.ensure_future(self._cancelled.wait())
            await asyncio.wait({credit, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            for waiter in (credit, cancelled):
                waiter.cancel()
            if credit.done() and not credit.cancelled():
                return
        await asyncio.sleep(self.script.delay_s)

    def _finish(self) -> ResponseDone:
        text = "".join(e.text for e in self.yielded if isinstance(e, TextDelta))
        chunks = [e for e in self.yielded if isinstance(e, AudioChunk)]
        usage = Usage(
            input_text_tokens=3,
            input_audio_tokens=5,
            input_image_tokens=self._conversation.image_tokens,
            output_text_tokens=sum(isinstance(e, TextDelta) for e in self.yielded),
            output_audio_tokens=sum(len(c.pcm) for c in chunks) // SAMPLES_PER_CODEC_TOKEN,
        )
        if self.cancel_reason is not None:
            status, reason, error = ResponseStatus.CANCELLED, self.cancel_reason, None
        else:
            status, reason, error = self.script.status, self.script.reason, self.script.error
        self.done = ResponseDone(
            status, usage, text=text, audio_samples=sum(len(c.pcm) for c in chunks), reason=reason, error=error
        )
        self._conversation._response_finished(self)
        return self.done


def _check_picture(picture: object) -> None:
    if not (isinstance(picture, np.ndarray) and picture.dtype == np.uint8 and picture.ndim == 3):
        raise InvalidImageError("not a uint8 (H, W, 3) array")
    if picture.shape[2] != 3 or picture.shape[0] < 1 or picture.shape[1] < 1:
        raise InvalidImageError(f"a picture of shape {picture.shape}")


TINY_VISION = VisionInfo(
    fps=2.0, min_pixels=56 * 56, max_pixels=28 * 28 * 1280, patch_size=14, merge_size=2, temporal_patch_size=2
)
"""A vision tower like Qwen2.5-Omni's (28-pixel grid, frames in pairs) for a :class:`FakeEngine` that sees."""


class FakeAudioInput:
    """A :class:`pipeline.api.AudioInputHandle` recording what was appended."""

    def __init__(self, conversation: FakeConversation, item_id: str) -> None:
        self.item_id = item_id
        self.chunks: list[np.ndarray] = []
        self.frames: list[tuple[tuple[int, ...], float]] = []
        """(shape, t) of each video frame added."""
        self.state = "open"
        self._conversation = conversation

    @property
    def samples(self) -> int:
        return sum(len(c) for c in self.chunks)

    def append(self, pcm: np.ndarray) -> None:
        assert self.state == "open", f"append to a {self.state} audio input"
        assert pcm.dtype == np.float32 and pcm.ndim == 1
        self.chunks.append(pcm)
        self._conversation.calls.append(("append", self.item_id, len(pcm)))

    def add_video_frame(self, frame: np.ndarray, t: float) -> None:
        """Like the engine's: refused without vision or for a frame that is not uint8 RGB; ``t`` never decreases."""
        assert self.state == "open", f"a video frame for a {self.state} audio input"
        vision = self._conversation._engine.vision
        if vision is None:
            raise UnsupportedInputError("no vision tower")
        _check_picture(frame)
        assert t >= 0 and (not self.frames or t >= self.frames[-1][1]), f"t went back to {t}"
        self.frames.append((frame.shape, t))
        self._conversation.calls.append(("video_frame", self.item_id, frame.shape, round(t, 3)))

    def commit(self) -> asyncio.Future:
        """Like the engine's: takes effect when called; the returned future holds the outcome."""
        assert self.state == "open"
        self.state = "committed"
        done = asyncio.get_running_loop().create_future()
        try:
            self._conversation._check_open("commit")
        except Exception as exc:  # the engine reports it through the awaitable, not at the call
            done.set_exception(exc)
            return done
        self._conversation.items.append(self.item_id)
        vision = self._conversation._engine.vision
        if self.frames and vision is not None:  # frames in pairs, each pair (h/28)*(w/28) positions
            height, width = self.frames[0][0][:2]
            self._conversation.image_tokens += vision.tokens(height, width, len(self.frames))
        self._conversation.calls.append(("commit", self.item_id, self.samples))
        held = self._conversation._engine.held_commits
        if held is not None:
            held.append(done)  # the test answers it
        else:
            done.set_result(None)
        return done

    async def discard(self) -> None:
        assert self.state == "open"
        self.state = "discarded"
        self._conversation.calls.append(("discard", self.item_id))


class FakeConversation:
    """A :class:`pipeline.api.ConversationHandle` that records calls and enforces the contract."""

    def __init__(self, engine: FakeEngine, instructions: str | None) -> None:
        self.id = f"fake_conv_{len(engine.conversations) + 1}"
        self.instructions = instructions if instructions is not None else engine.default_instructions
        self.calls: list[tuple] = [("open", self.instructions)]
        self.items: list[str] = []
        self.inputs: dict[str, FakeAudioInput] = {}
        self.responses: list[FakeResponse] = []
        self.active: FakeResponse | None = None
        self.closed = False
        self.image_tokens = 0
        """Thinker positions of every picture and video frame in the conversation (reported in usage)."""
        self._engine = engine

    def _check_open(self, method: str) -> None:
        if self.closed:
            raise EngineClosedError("conversation closed")
        failure = self._engine.failures.pop(method, None)
        if failure is not None:
            raise failure

    def _check_idle(self, what: str) -> None:
        if self.active is not None:
            raise ResponseActiveError(f"cannot {what} while {self.active.id} runs")

    def _check_item(self, item_id: str) -> None:
        if item_id not in self.items:
            raise UnknownItemError(f"no item {item_id}", param="item_id")

    async def set_instructions(self, instructions: str) -> None:
        self._check_open("set_instructions")
        self.instructions = instructions
        self.calls.append(("set_instructions", instructions))

    async def set_context_policy(self, policy: ContextPolicy | None) -> None:
        self._check_open("set_context_policy")
        self.calls.append(("set_context_policy", policy))

    async def set_tools(self, tools: tuple[Tool, ...]) -> None:
        self._check_open("set_tools")
        self._check_idle("set tools")
        self.calls.append(("set_tools", tuple(tool.name for tool in tools)))

    async def add_function_call(self, item_id: str, name: str, arguments: str) -> None:
        self._check_open("add_function_call")
        self.items.append(item_id)
        self.calls.append(("add_function_call", item_id, name, arguments))

    async def add_function_output(self, item_id: str, output: str) -> None:
        self._check_open("add_function_output")
        self.items.append(item_id)
        self.calls.append(("add_function_output", item_id, output))

    def _place(self, item_id: str, previous_item_id: str | None) -> None:
        """As the engine: appended, or inserted after ``previous_item_id`` (root: first) while no response runs."""
        if previous_item_id is None:
            self.items.append(item_id)
            return
        index = 0 if previous_item_id == ROOT_ITEM_ID else None
        if index is None:
            if previous_item_id not in self.items:
                raise UnknownItemError(f"no item {previous_item_id}", param="previous_item_id")
            index = self.items.index(previous_item_id) + 1
        if index < len(self.items):
            self._check_idle("insert")
        self.items.insert(index, item_id)

    async def add_text(
        self, item_id: str, text: str, role: Role = "user", *, previous_item_id: str | None = None
    ) -> None:
        self._check_open("add_text")
        self._place(item_id, previous_item_id)
        call = ("add_text", item_id, text, role)
        self.calls.append(call if previous_item_id is None else (*call, previous_item_id))

    async def add_audio(self, item_id: str, pcm: np.ndarray, *, previous_item_id: str | None = None) -> None:
        self._check_open("add_audio")
        assert pcm.dtype == np.float32 and pcm.ndim == 1
        self._place(item_id, previous_item_id)
        call = ("add_audio", item_id, len(pcm))
        self.calls.append(call if previous_item_id is None else (*call, previous_item_id))

    async def add_content(
        self, item_id: str, parts: tuple[str | np.ndarray, ...], *, previous_item_id: str | None = None
    ) -> None:
        self._check_open("add_content")
        vision = self._engine.vision
        if vision is None:
            raise UnsupportedInputError("no vision tower")
        shapes: list = []
        for part in parts:
            if isinstance(part, str):
                shapes.append("text")
                continue
            _check_picture(part)
            shapes.append(part.shape)
        self._place(item_id, previous_item_id)
        self.image_tokens += sum(vision.tokens(*shape[:2]) for shape in shapes if shape != "text")
        call = ("add_content", item_id, tuple(shapes))
        self.calls.append(call if previous_item_id is None else (*call, previous_item_id))

    def open_audio(self, item_id: str) -> FakeAudioInput:
        self._check_open("open_audio")
        previous = self.inputs.get(item_id)
        # as the engine: an id may be recorded again once its message was committed and deleted
        assert previous is None or (previous.state != "open" and item_id not in self.items), f"{item_id} opened twice"
        handle = FakeAudioInput(self, item_id)
        self.inputs[item_id] = handle
        self.calls.append(("open_audio", item_id))
        return handle

    async def delete_item(self, item_id: str) -> None:
        self._check_open("delete_item")
        self._check_idle("delete")
        self._check_item(item_id)
        self.items.remove(item_id)
        self.calls.append(("delete", item_id))

    async def truncate_item(self, item_id: str, audio_end_ms: int) -> None:
        self._check_open("truncate_item")
        self._check_idle("truncate")
        self._check_item(item_id)
        self.calls.append(("truncate", item_id, audio_end_ms))

    def respond(
        self,
        *,
        item_id: str,
        modalities: frozenset[Modality] = frozenset({"text", "audio"}),
        voice: str | None = None,
        max_output_tokens: int | None = None,
        tool_choice: ToolChoice = AUTO,
        call_item_ids: tuple[str, ...] = (),
    ) -> FakeResponse:
        self._check_open("respond")
        self._check_idle("respond")
        if voice is not None and voice not in self._engine.voices:
            raise UnknownVoiceError(f"unknown voice {voice}", param="voice")
        response = FakeResponse(self, item_id, modalities, self._engine.next_script(self.instructions))
        self.responses.append(response)
        self.active = response
        self.items.append(item_id)
        self.calls.append(("respond", item_id, tuple(sorted(modalities)), voice, max_output_tokens))
        return response

    def _response_finished(self, response: FakeResponse) -> None:
        if self.active is response:
            self.active = None

    async def close(self) -> None:
        if self.active is not None:
            self.active.cancel("conversation_closed")
        self.closed = True
        self.calls.append(("close",))


class FakeEngine:
    """An :class:`pipeline.api.EngineHandle` whose responses play queued scripts (``script``)
    or ``default_script``."""

    model_name = "fake-omni"
    voices = ("Chelsie", "Ethan")
    default_voice = "Chelsie"
    audio_output = True
    default_instructions = "You are a fake assistant."
    random_weights = True
    max_output_tokens = 4096
    transcription_prompt = TranscriptionPrompt(
        instructions="You are a fake speech recognizer.",
        request="Write it down.",
        language_hint="Language: {language}.",
        context_hint="Context: {prompt}",
    )

    def __init__(
        self,
        default_script: Script | None = None,
        transcription_script: Script | None = None,
        *,
        vision: VisionInfo | None = None,
    ) -> None:
        self.vision = vision
        """None (the default): the engine cannot see, as a checkpoint without a vision tower."""
        self.default_script = default_script or Script()
        self.transcription_script = transcription_script or Script(text=("I said", " hello."), audio_chunks=0)
        """What every transcription side reply (a conversation opened with ``transcription_prompt``) plays."""
        self.scripts: deque[Script] = deque()
        self.conversations: list[FakeConversation] = []
        self.failures: dict[str, Exception] = {}
        self.held_commits: list[asyncio.Future] | None = None
        """When a list, commits take effect but their answers wait there for the test to set them."""

    def fail_next(self, method: str, exc: Exception) -> None:
        """The next call of conversation method ``method`` raises ``exc``."""
        self.failures[method] = exc

    def script(self, *scripts: Script) -> None:
        """Queue scripts for the next responses, in order."""
        self.scripts.extend(scripts)

    def next_script(self, instructions: str | None = None) -> Script:
        """The script of the next response of a conversation with ``instructions``: a transcription side reply
        plays ``transcription_script``, any other the next queued script or ``default_script``."""
        if instructions == self.transcription_prompt.instructions:
            return self.transcription_script
        return self.scripts.popleft() if self.scripts else self.default_script

    def conversation(self, *, instructions: str | None = None) -> FakeConversation:
        conversation = FakeConversation(self, instructions)
        self.conversations.append(conversation)
        return conversation


# --- turn detection and transport ---------------------------------------------------------------


@dataclass
class FakeTurnDetector:
    """A turn detector that reports speech by a rule on the audio: ``speech(chunk) -> bool`` per
    fed chunk (default: RMS above 0.05). Times are ms since its first sample (16 kHz)."""

    params: ServerVadParams
    speech: Callable[[np.ndarray], bool] = lambda pcm: bool(len(pcm)) and float(np.sqrt(np.mean(pcm**2))) > 0.05
    fed_samples: int = 0
    speaking: bool = False
    silence_ms: float = 0.0
    resets: int = 0
    log: list[np.ndarray] = field(default_factory=list)

    async def afeed(self, pcm16k: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        return self.feed(pcm16k)

    def feed(self, pcm16k: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        self.log.append(pcm16k)
        start_ms = self.fed_samples * 1000 // INPUT_SAMPLE_RATE
        self.fed_samples += len(pcm16k)
        end_ms = self.fed_samples * 1000 // INPUT_SAMPLE_RATE
        if not len(pcm16k):
            return []
        if self.speech(pcm16k):
            self.silence_ms = 0.0
            if not self.speaking:
                self.speaking = True
                return [SpeechStarted(max(0, start_ms - self.params.prefix_padding_ms), start_ms)]
            return []
        if self.speaking:
            self.silence_ms += end_ms - start_ms
            if self.silence_ms >= self.params.silence_duration_ms:
                self.speaking = False
                return [SpeechStopped(end_ms, int(end_ms - self.silence_ms))]
        return []

    def reset(self) -> None:
        self.resets += 1
        self.speaking = False
        self.silence_ms = 0.0


class MemoryTransport:
    """An in-memory client connection: the test sends client messages with :meth:`client_send`
    and reads server events with :meth:`next_event` / :meth:`wait_for`; :meth:`disconnect`
    ends the message stream as a closed socket would."""

    _END = object()

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.closed = False
        self._incoming: asyncio.Queue = asyncio.Queue()
        self._arrived = asyncio.Condition()
        self._read = 0

    # client side
    def client_send(self, event: dict | str) -> None:
        self._incoming.put_nowait(event if isinstance(event, str) else json.dumps(event))

    def disconnect(self) -> None:
        self._incoming.put_nowait(self._END)

    async def wait_for(self, event_type: str, timeout: float = 5.0) -> dict:
        """The next unread event of ``event_type`` (events before it count as read)."""

        async def found() -> dict:
            async with self._arrived:
                while True:
                    for i in range(self._read, len(self.sent)):
                        if self.sent[i]["type"] == event_type:
                            self._read = i + 1
                            return self.sent[i]
                    await self._arrived.wait()

        return await asyncio.wait_for(found(), timeout)

    def types(self) -> list[str]:
        return [e["type"] for e in self.sent]

    # server side (realtime.runner.Transport)
    async def __aiter__(self) -> AsyncIterator[str]:
        while True:
            message = await self._incoming.get()
            if message is self._END:
                return
            yield message

    async def send(self, event: dict) -> None:
        if self.closed:
            raise TransportClosed("closed")
        json.dumps(event)  # what a real transport does: every event must be JSON-serializable
        async with self._arrived:
            self.sent.append(event)
            self._arrived.notify_all()

    async def close(self) -> None:
        self.closed = True
