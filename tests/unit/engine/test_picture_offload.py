"""Pictures off the engine thread: the preprocessing pool (the grid known at once, bad pictures refused at once, the
work on the pool's threads, its room bounded), image encodes fed by its futures and by the vision worker's thread
(blocks ready only once collected, a job at a time, failures recorded by the engine thread), and the scheduler's rule
that no prefill chunk reaches a picture that is not ready."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pipeline.api import VisionInfo
from pipeline.core.conversation_state import ConversationState, ConvItem, ImageBlock, ItemKind
from pipeline.errors import InvalidImageError
from pipeline.models.common.tmrope import TMROPE
from pipeline.models.qwen2_5_omni.vision import Qwen25OmniVisionPreprocessor
from pipeline.runners.image_encodes import ImageEncodes
from pipeline.runners.kv_pool import SlotAllocator
from pipeline.runners.picture_prep import PicturePrep
from pipeline.scheduler.kv_slots import KVSlots
from pipeline.scheduler.prefill_batch import PrefillBatch
from pipeline.scheduler.prefill_plan import PrefillPlanner

MERGE = 2
INFO = VisionInfo(
    fps=2.0, min_pixels=56 * 56, max_pixels=28 * 28 * 64, patch_size=14, merge_size=2, temporal_patch_size=2
)
PREPROCESS = Qwen25OmniVisionPreprocessor(info=INFO, image_mean=(0.5, 0.5, 0.5), image_std=(0.25, 0.25, 0.25))
WAIT_S = 10.0


def frame(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# -- the preprocessing pool -----------------------------------------------------------------------------
def test_the_grid_is_known_at_once_and_equals_the_preprocessing_s():
    prep = PicturePrep(PREPROCESS, INFO)
    try:
        for frames in ([frame(60, 90)], [frame(120, 40), frame(120, 40)], [frame(300, 500)], [frame(10, 12)]):
            assert prep.grid(frames) == tuple(PREPROCESS(frames).grid_thw)
            vi = prep.submit(frames).result(WAIT_S)
            assert vi.grid_thw == PREPROCESS(frames).grid_thw and np.array_equal(vi.pixel_values, PREPROCESS(frames)[0])
    finally:
        prep.close()


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [np.zeros((4, 4), np.uint8)],
        [np.zeros((0, 8, 3), np.uint8)],
        [np.zeros((8, 8, 3), np.float32)],
        [b"png"],
        [frame(2, 600)],
    ],
    ids=["none", "2-d", "empty", "float", "bytes", "aspect"],
)
def test_a_bad_picture_is_refused_by_the_check_as_the_preprocessing_refuses_it(frames):
    prep = PicturePrep(PREPROCESS, INFO)
    try:
        with pytest.raises(InvalidImageError) as checked:
            prep.grid(frames)
        with pytest.raises(InvalidImageError) as preprocessed:
            PREPROCESS(frames)
        assert (str(checked.value), checked.value.param) == (str(preprocessed.value), preprocessed.value.param)
        assert prep.pending == 0
    finally:
        prep.close()


def test_the_work_runs_on_the_pool_s_threads_and_its_room_is_bounded():
    release, threads, woken = threading.Event(), [], []

    def preprocess(frames):
        threads.append(threading.current_thread().name)
        assert release.wait(WAIT_S)
        return PREPROCESS(frames)

    prep = PicturePrep(preprocess, INFO, threads=2, max_pending=3)
    prep.on_done = lambda: woken.append(threading.current_thread().name)
    try:
        futures = [prep.submit([frame(60, 90, seed)]) for seed in range(3)]
        assert prep.pending == 3 and not prep.has_room, "three jobs queued or running: full"
        late = prep.submit([frame(60, 90, 3)])  # a submit past the bound still queues (the caller admits)
        assert prep.pending == 4
        release.set()
        values = [f.result(WAIT_S) for f in [*futures, late]]
        assert [v.grid_thw for v in values] == [PREPROCESS([frame(60, 90)]).grid_thw] * 4
        assert threads and all(name.startswith("omni-picture-prep") for name in threads)
        assert threading.current_thread().name not in threads
        for _ in range(100):  # the done callbacks run right after each result
            if len(woken) == 4:
                break
            threading.Event().wait(0.01)
        assert len(woken) == 4 and prep.pending == 0 and prep.has_room
    finally:
        release.set()
        prep.close()


def test_a_failing_preprocessing_is_its_future_s_exception():
    def preprocess(frames):
        raise MemoryError("no room for the picture")

    prep = PicturePrep(preprocess, INFO)
    try:
        with pytest.raises(MemoryError):
            prep.submit([frame(60, 90)]).result(WAIT_S)
    finally:
        prep.close()


# -- image encodes fed by the pool and by the worker -------------------------------------------------
class FakeVision:
    """Encodes a (1, h, w) grid to (h // 2) * (w // 2) rows of the value h (+ 1000 * the pixels' first value); raises
    for the heights in ``fail_on``; the first call waits for ``gate`` (when given); records each call's heights and
    thread."""

    image_deepstack_layers = 0

    def __init__(self, fail_on: set[int] = frozenset(), gate: threading.Event | None = None) -> None:
        self.fail_on, self.gate = fail_on, gate
        self.calls: list[list[int]] = []
        self.threads: list[str] = []

    def image_tokens(self, grid_thw) -> int:
        t, h, w = grid_thw
        return t * (h // MERGE) * (w // MERGE)

    def encode_images(self, items):
        self.threads.append(threading.current_thread().name)
        if self.gate is not None and not self.calls:
            self.calls.append([grid[1] for _, grid in items])
            assert self.gate.wait(WAIT_S)
        else:
            self.calls.append([grid[1] for _, grid in items])
        if any(grid[1] in self.fail_on for _, grid in items):
            raise RuntimeError("boom")
        return [
            torch.full((self.image_tokens(grid), 3), float(grid[1]) + 1000 * float(np.asarray(px).flat[0]))
            for px, grid in items
        ]


def encodes(vision: FakeVision, *, prep: PicturePrep | None = None, worker: bool = False) -> ImageEncodes:
    return ImageEncodes(
        vision,
        positions=TMROPE,
        merge=MERGE,
        width=3,
        dtype=torch.float32,
        device=torch.device("cpu"),
        prep=prep,
        worker=worker,
    )


def picture(h: int, w: int = 4, value: float = 0.0) -> tuple[np.ndarray, tuple[int, int, int]]:
    return np.full((h * w, 8), value, dtype=np.float32), (1, h, w)


def flush_until_ready(queue: ImageEncodes, *blocks: ImageBlock) -> None:
    for _ in range(int(WAIT_S / 0.005)):
        queue.flush()
        if all(b.ready for b in blocks):
            return
        threading.Event().wait(0.005)
    raise AssertionError("the blocks never turned ready")


def test_a_block_waits_for_its_preprocessing_and_then_encodes_with_its_pixels():
    release = threading.Event()

    def preprocess(frames):
        assert release.wait(WAIT_S)
        return PREPROCESS(frames)

    vision = FakeVision()
    queue = encodes(vision, prep=PicturePrep(preprocess, INFO))
    try:
        shot = frame(60, 90)
        block = queue.picture([shot])
        want = PREPROCESS([shot])
        assert not block.ready and queue.pending == 1
        assert block.embeds.shape[0] == vision.image_tokens(want.grid_thw)
        assert queue.flush() == 0 and vision.calls == [] and not block.ready, "still being preprocessed"
        release.set()
        flush_until_ready(queue, block)
        assert vision.calls == [[want.grid_thw[1]]] and block.error is None and queue.pending == 0
        assert torch.all(block.embeds == want.grid_thw[1] + 1000 * float(want.pixel_values.flat[0]))
    finally:
        release.set()
        queue.close()


def test_a_failed_preprocessing_or_a_grid_other_than_checked_fails_its_block_only():
    def preprocess(frames):
        if frames[0].shape[0] == 61:
            raise MemoryError("no room for the picture")
        vi = PREPROCESS(frames)
        return vi._replace(grid_thw=(1, 2, 2)) if frames[0].shape[0] == 62 else vi

    vision = FakeVision()
    queue = encodes(vision, prep=PicturePrep(preprocess, INFO))
    try:
        good, failed, wrong = (queue.picture([frame(h, 90)]) for h in (60, 61, 62))
        flush_until_ready(queue, good, failed, wrong)
        assert good.error is None and isinstance(failed.error, MemoryError)
        assert str(wrong.error) == "picture preprocessing gave a grid of (1, 2, 2), expected (1, 4, 6)"
        assert len(vision.calls) == 1 and len(vision.calls[0]) == 1, "only the good picture reaches the tower"
    finally:
        queue.close()


def test_the_worker_encodes_on_its_thread_a_job_at_a_time_and_blocks_turn_ready_when_collected():
    gate = threading.Event()
    vision = FakeVision(gate=gate)
    queue = encodes(vision, worker=True)
    try:
        first = queue.block(*picture(4, value=1.0))
        assert queue.flush() == 0 and queue.pending == 1, "submitted to the worker: not ready"
        for _ in range(int(WAIT_S / 0.005)):  # the worker holds the job (its first call waits for the gate)
            if vision.calls:
                break
            threading.Event().wait(0.005)
        second, third = queue.block(*picture(6, value=2.0)), queue.block(*picture(8, value=3.0))
        assert queue.flush() == 0 and vision.calls == [[4]], "one job at a time: the new ones wait"
        assert not (first.ready or second.ready or third.ready) and queue.pending == 3
        gate.set()
        flush_until_ready(queue, first)
        flush_until_ready(queue, second, third)
        assert vision.calls == [[4], [6, 8]], "what waited went as one batch"
        assert set(vision.threads) == {"omni-vision"}
        assert [float(b.embeds[0, 0]) for b in (first, second, third)] == [1004.0, 2006.0, 3008.0]
        assert queue.pending == 0 and all(b.error is None for b in (first, second, third))
    finally:
        gate.set()
        queue.close()


def test_a_picture_failing_in_the_worker_keeps_its_error_set_by_the_engine_thread():
    vision = FakeVision(fail_on={6})
    queue = encodes(vision, worker=True)
    try:
        good, bad = queue.block(*picture(4)), queue.block(*picture(6))
        queue.flush()
        for _ in range(int(WAIT_S / 0.005)):
            if len(vision.calls) == 3:
                break
            threading.Event().wait(0.005)
        assert bad.error is None and not bad.ready, "the worker records nothing on a block"
        flush_until_ready(queue, good, bad)
        assert vision.calls == [[4, 6], [4], [6]], "the batch failed: each alone, on the worker"
        assert good.error is None and torch.all(good.embeds == 4)
        assert isinstance(bad.error, RuntimeError) and str(bad.error) == "boom"
    finally:
        queue.close()


# -- the scheduler's rule -----------------------------------------------------------------------------
class Renderer:
    """One id per word; a message is header (2 ids), its words, footer (1 id); a picture is vision start, its
    tokens, vision end."""

    special = SimpleNamespace(image_token=903, vision_start=904, vision_end=905)

    def header(self, role: str) -> list[int]:
        return [1, {"system": 10, "user": 11, "assistant": 12}[role]]

    def footer(self) -> list[int]:
        return [2]

    def text_message(self, role: str, text: str) -> list[int]:
        return self.header(role) + [100 + len(word) for word in text.split()] + self.footer()

    def content_message(self, role: str, parts) -> list:
        segments, ids = [], self.header(role)
        for part in parts:
            if isinstance(part, str):
                ids = ids + [100 + len(word) for word in part.split()]
                continue
            segments += [ids + [self.special.vision_start], part]
            ids = [self.special.vision_end]
        return segments + [ids + self.footer()]


def planner(conversations: dict, chunk_tokens: int = 512) -> PrefillPlanner:
    cfg = SimpleNamespace(prefill_chunk_tokens=chunk_tokens)
    slots = KVSlots(SlotAllocator(4), SlotAllocator(4), conversations)
    return PrefillPlanner(cfg, slots=slots, positions=TMROPE, conversations=conversations)


def image_block(tokens: int, *, ready: bool) -> ImageBlock:
    offsets = TMROPE.image_offsets((1, 2, 2 * tokens), merge=MERGE)
    return ImageBlock(torch.zeros(tokens, 3), offsets=offsets, ready=ready)


def picture_conversation(block: ImageBlock) -> ConversationState:
    conv = ConversationState("c", Renderer(), instructions="be brief", max_context_tokens=10_000)
    conv.add(ConvItem(id="u", role="user", kind=ItemKind.CONTENT, parts=["look at", block, "please"]))
    conv.slot = 0
    return conv


def test_a_chunk_that_would_reach_a_picture_not_ready_waits_and_boundaries_stay_the_same():
    block = image_block(4, ready=False)
    conv = picture_conversation(block)
    rendering = conv.render()
    at = rendering.ready_until
    assert at is not None and rendering.token_ids[at - 1] == Renderer.special.vision_start
    assert rendering.token_ids[at] == Renderer.special.image_token
    assert planner({"c": conv}).chunk(conv, 0, rendering, need_logits=True) is None, "the whole prompt waits"
    small = planner({"c": conv}, chunk_tokens=at - 1)
    job = small.chunk(conv, 0, rendering, need_logits=True)
    assert job is not None and (job.start, len(job.keys), job.last) == (0, at - 1, False), "a chunk before it runs"
    conv.cached_keys.extend(job.keys)
    assert small.chunk(conv, 0, conv.render(), need_logits=True) is None, "the next chunk would reach it: waits"
    block.ready = True
    rendering = conv.render()
    assert rendering.ready_until is None
    job = small.chunk(conv, 0, rendering, need_logits=True)
    assert job is not None and job.start == at - 1, "the same boundaries as ever"
    assert job.keys == rendering.keys[at - 1 : 2 * (at - 1)]
    assert len(job.audio) == 1 and job.audio[0][0] == 1, "the picture from its first position"


def test_a_prompt_waits_for_its_picture_and_a_background_prefill_plans_nothing_meanwhile():
    block = image_block(4, ready=False)
    conv = picture_conversation(block)
    plan = planner({"c": conv})
    batch = PrefillBatch(4, None)
    assert plan.background(batch) == 0 and batch.jobs == [] and conv.dirty, "the picture is not ready: nothing"
    block.ready = True
    assert plan.background(batch) == 1 and batch.jobs[0].last and conv.dirty
