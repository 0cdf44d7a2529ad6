"""Camera video in spoken messages end to end: the engine's greedy replies to audio with video, prefilled chunk by
chunk while the message is spoken, equal transformers' thinker fed the same features and pixel values with
``use_audio_in_video=True``, on the tiny checkpoint and on the sharpened one (where wrong positions change the
tokens); the engine's positions equal ``get_rope_index``; incremental equals one-shot; a turn after a video turn
reuses the cache exactly; the video budget removes old messages' video and the next turn equals the reference over
what is kept; bad frames are refused and the message carries on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5OmniThinkerForConditionalGeneration, WhisperFeatureExtractor

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.errors import InvalidImageError, UnsupportedInputError
from pipeline.models.common.hf_parts import thinker_audio_tower
from pipeline.models.common.tmrope import rope_positions
from pipeline.models.qwen2_5_omni.av_interleave import Qwen25OmniAVLayout
from pipeline.models.qwen2_5_omni.prompt import DEFAULT_SYSTEM_PROMPT
from pipeline.response_events import ResponseStatus
from tests.helpers.camera_clips import RATE, STEP_S, camera, speak, speech

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
TEXT = frozenset({"text"})
CLIP = (speech(5.3, 1), camera(11, 2))
"""5.3 s of audio, 11 frames: 6 frame pairs (the last one its frame twice) in 3 chunks."""
CLIP2 = (speech(3.2, 3), camera(5, 4, 90, 150))


def engine_for(path, **thinker) -> OmniEngine:
    return OmniEngine.from_pretrained(path, greedy_stage_config(thinker={"audio_floor": "exact", **thinker}), seed=7)


@pytest.fixture(scope="module", params=["tiny_model_dir", "sharp_model_dir"], ids=["plain", "sharp"])
def setup(request):
    path = request.getfixturevalue(request.param)
    engine = engine_for(path)
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    yield engine, Reference(engine, thinker, path)
    engine.close()


class Reference:
    """transformers' thinker on the same input, the processor's work done by hand: the chat layout of spoken
    messages with video (:class:`Qwen25OmniAVLayout`'s placeholder order, itself tested against the processor), Whisper
    features, the engine's preprocessing of each frame pair."""

    def __init__(self, engine: OmniEngine, thinker, path) -> None:
        self.engine, self.thinker = engine, thinker
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.features = WhisperFeatureExtractor.from_pretrained(path)
        core = engine.core
        self.special, self.preprocess = core.special, core.family.vision_preprocessor(core.ckpt)
        self.timing = core.family.av_timing(core.ckpt)

    def inputs(self, turns: list[tuple[np.ndarray, list[np.ndarray] | None, list[int]]]) -> dict:
        """``turns``: (audio, frames at 2 fps or None, the assistant's reply ids after it; [] for the turn being
        answered). Returns the thinker's generate/get_rope_index inputs."""
        s, enc = self.special, self.tokenizer.encode
        ids = [s.im_start, *enc(f"system\n{DEFAULT_SYSTEM_PROMPT}", add_special_tokens=False), s.im_end]
        ids += enc("\n", add_special_tokens=False)
        feats, masks, pixels, grids, seqlens = [], [], [], [], []
        for pcm, frames, reply in turns:
            f = self.features(pcm, sampling_rate=RATE, return_attention_mask=True, padding="max_length")
            feats.append(torch.tensor(np.asarray(f["input_features"][0])))
            masks.append(torch.tensor(np.asarray(f["attention_mask"][0])))
            frames_n = int(masks[-1].sum())
            seqlens.append(frames_n)
            n_audio = int(thinker_audio_tower(self.thinker)._get_feat_extract_output_lengths(torch.tensor(frames_n))[1])
            ids += [s.im_start, *enc("user\n", add_special_tokens=False)]
            if frames is None:
                ids += [s.audio_start] + [s.audio_token] * n_audio + [s.audio_end]
            else:
                pairs = [self.preprocess(frames[i : i + 2]) for i in range(0, len(frames), 2)]
                pixels += [p.pixel_values for p in pairs]
                _, gh, gw = pairs[0].grid_thw
                grids.append([len(pairs), gh, gw])
                layout = Qwen25OmniAVLayout(
                    self.timing, rows=gh // 2, cols=gw // 2, n_patches=len(pairs), n_audio=n_audio
                )
                ids += layout.token_ids(
                    vision_start=s.vision_start,
                    audio_start=s.audio_start,
                    video=s.video_token,
                    audio=s.audio_token,
                    audio_end=s.audio_end,
                    vision_end=s.vision_end,
                )
            ids += [s.im_end, *enc("\n", add_special_tokens=False)]
            ids += [s.im_start, *enc("assistant\n", add_special_tokens=False)]
            if reply:
                ids += reply + [s.im_end, *enc("\n", add_special_tokens=False)]
        out = dict(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            input_features=torch.stack(feats),
            feature_attention_mask=torch.stack(masks),
            use_audio_in_video=True,
        )
        if grids:
            out |= dict(
                pixel_values_videos=torch.from_numpy(np.concatenate(pixels)),
                video_grid_thw=torch.tensor(grids),
                video_second_per_grid=torch.tensor([self.timing.second_per_grid] * len(grids)),
            )
        return out

    def reply(self, turns) -> list[int]:
        inputs = self.inputs(turns)
        with torch.inference_mode():
            out = self.thinker.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False, repetition_penalty=1.0)
        reply = out[0, inputs["input_ids"].shape[1] :].tolist()
        return [t for t in reply if t not in (self.special.im_end, self.special.endoftext)]

    def positions(self, turns) -> tuple[list[int], np.ndarray]:
        """The prompt's ids and (3, L) positions from ``get_rope_index`` (without the reply header of the last
        turn)."""
        inputs = self.inputs(turns)
        header = 1 + len(self.tokenizer.encode("assistant\n", add_special_tokens=False))
        n = inputs["input_ids"].shape[1] - header
        pos, _ = self.thinker.get_rope_index(
            inputs["input_ids"],
            None,
            inputs.get("video_grid_thw"),
            inputs["attention_mask"],
            use_audio_in_video=True,
            audio_seqlens=inputs["feature_attention_mask"].sum(-1),
            second_per_grids=inputs.get("video_second_per_grid"),
        )
        return inputs["input_ids"][0, :n].tolist(), pos[:, 0, :n].numpy()


async def answer(conv, item_id: str):
    done = await conv.respond(item_id=item_id, modalities=TEXT, max_output_tokens=MAX_TOKENS).wait()
    assert done.status is not ResponseStatus.FAILED, done.error
    return done


def video_tokens(engine, clip) -> int:
    frames = clip[1]
    return engine.vision.tokens(*frames[0].shape[:2], frames=len(frames))


async def test_spoken_video_matches_the_reference_and_its_positions(setup):
    engine, ref = setup
    conv = engine.conversation()
    handle = conv.open_audio("u1")
    pcm, frames = CLIP
    step = int(STEP_S * RATE)
    cached_while_speaking = []
    for k in range(-(-len(pcm) // step)):
        handle.append(pcm[k * step : (k + 1) * step])
        if k < len(frames):
            handle.add_video_frame(frames[k], k * STEP_S)
        await engine.wait_idle()
        cached_while_speaking.append(len(engine.core.conversations.get(conv.id).cached_keys))
    await handle.commit()
    state = engine.core.conversations.get(conv.id)
    rendering = state.render()
    want_ids, want_positions = ref.positions([(pcm, frames, [])])
    assert rendering.token_ids == want_ids
    np.testing.assert_array_equal(rope_positions(len(rendering.keys), rendering.spans), want_positions)
    # the chunks were prefilled while speaking: two of the three before the end
    # every chunk but the last was prefilled while speaking: at commit only the last chunk (2 frame pairs and the
    # audio after 4 s) and the closing markers and footer remained
    per_pair = engine.vision.tokens(*frames[0].shape[:2], frames=2)
    n_audio = len(rendering.audio) - rendering.image_tokens
    last_chunk = 2 * per_pair + n_audio - 2 * ref.timing.tokens_per_chunk
    closing = 2 + len(engine.core.renderer.footer())
    assert cached_while_speaking[-1] == len(rendering.keys) - last_chunk - closing
    assert sorted(set(cached_while_speaking))[1:] == [
        cached_while_speaking[-1] - 2 * per_pair - 50,
        cached_while_speaking[-1],
    ]
    done = await answer(conv, "a1")
    assert list(done.text_token_ids) == ref.reply([(pcm, frames, [])])
    assert done.usage.input_image_tokens == video_tokens(engine, CLIP)
    assert done.usage.cached_tokens >= max(cached_while_speaking)
    await conv.close()


async def test_incremental_equals_one_shot_and_the_next_turn_reuses_the_cache(setup):
    engine, ref = setup
    replies = []
    for incremental in (True, False):
        conv = engine.conversation()
        await speak(engine, conv, "u1", CLIP, incremental=incremental)
        replies.append(await answer(conv, "a1"))
        await conv.close()
    assert replies[0].text_token_ids == replies[1].text_token_ids
    first = list(replies[0].text_token_ids)

    conv = engine.conversation()
    await speak(engine, conv, "u1", CLIP)
    assert list((await answer(conv, "a1")).text_token_ids) == first
    await speak(engine, conv, "u2", CLIP2)
    second = await answer(conv, "a2")
    assert second.usage.cached_tokens > len(engine.core.conversations.get(conv.id).cached_keys) // 2
    assert list(second.text_token_ids) == ref.reply([(CLIP[0], CLIP[1], first), (CLIP2[0], CLIP2[1], [])])
    stats = await engine.stats()
    assert stats.video_positions >= video_tokens(engine, CLIP) + video_tokens(engine, CLIP2)
    await conv.close()


async def test_the_video_budget_removes_old_video_and_keeps_the_rest_exact(sharp_model_dir):
    """A 2-second budget: before the second reply the first message (3 s of video) loses its video, not its audio;
    the reply equals the reference over the first message as plain audio and the second with its video."""
    engine = engine_for(sharp_model_dir, video_history_seconds=2)
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(sharp_model_dir, dtype=torch.float32).eval()
    ref = Reference(engine, thinker, sharp_model_dir)
    try:
        conv = engine.conversation()
        await speak(engine, conv, "u1", CLIP2)
        first = list((await answer(conv, "a1")).text_token_ids)
        assert first == ref.reply([(CLIP2[0], CLIP2[1], [])])
        await speak(engine, conv, "u2", CLIP)
        second = await answer(conv, "a2")
        assert second.usage.input_image_tokens == video_tokens(engine, CLIP)
        assert list(second.text_token_ids) == ref.reply([(CLIP2[0], None, first), (CLIP[0], CLIP[1], [])])
        assert list(second.text_token_ids) != ref.reply([(CLIP2[0], CLIP2[1], first), (CLIP[0], CLIP[1], [])])
        assert (await engine.stats()).video_positions == video_tokens(engine, CLIP)
        await conv.close()
    finally:
        engine.close()


async def test_on_the_sharpened_checkpoint_1d_positions_change_the_reply(sharp_model_dir, monkeypatch):
    """What makes the equivalence above a position check: with the video message's positions 1-D (rope = cache
    index), the sharpened model's greedy reply differs from the reference's."""
    engine = engine_for(sharp_model_dir)
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(sharp_model_dir, dtype=torch.float32).eval()
    want = Reference(engine, thinker, sharp_model_dir).reply([(CLIP[0], CLIP[1], [])])
    one_d = SimpleNamespace(rope_positions=lambda *args, **kwargs: None, rope_shift=lambda *args: 0)
    monkeypatch.setattr(engine.core.scheduler.prefill, "positions", one_d)
    try:
        conv = engine.conversation()
        await speak(engine, conv, "u1", CLIP, incremental=False)
        assert list((await answer(conv, "a1")).text_token_ids) != want
    finally:
        engine.close()


async def test_bad_and_dropped_frames(tiny_engine):
    """A frame that is not a picture is refused (the message carries on); a second frame in a slot and a frame of
    another size are dropped and counted; without a vision tower frames are refused."""
    conv = tiny_engine.conversation()
    handle = conv.open_audio("u1")
    before = (await tiny_engine.stats()).video_frames_dropped_total
    for bad in (np.zeros((4, 4), np.uint8), np.zeros((0, 8, 3), np.uint8), np.zeros((8, 8, 3), np.float32), b"x"):
        with pytest.raises(InvalidImageError):
            handle.add_video_frame(bad, 0.0)
    pcm, frames = CLIP2
    handle.add_video_frame(frames[0], 0.0)
    handle.add_video_frame(frames[1], 0.1)  # the same slot: dropped
    handle.add_video_frame(camera(1, 9, 300, 60)[0], 0.5)  # another size: dropped
    handle.add_video_frame(frames[1], 0.6)
    handle.append(pcm)
    await handle.commit()
    done = await answer(conv, "a1")
    assert done.usage.input_image_tokens == tiny_engine.vision.tokens(*frames[0].shape[:2], frames=2)
    assert (await tiny_engine.stats()).video_frames_dropped_total == before + 2
    vision, tiny_engine.vision = tiny_engine.vision, None
    try:
        with pytest.raises(UnsupportedInputError):
            conv.open_audio("u2").add_video_frame(frames[0], 0.0)
    finally:
        tiny_engine.vision = vision
    await conv.close()
