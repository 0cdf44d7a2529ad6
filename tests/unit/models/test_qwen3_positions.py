"""Qwen3-Omni's TMRoPE positions in the form the engine consumes them (pipeline/models/qwen3_omni/positions.py: the
rendering's :class:`GridSpan` list, ``rope_positions``, ``rope_shift``; pipeline/models/qwen3_omni/av_interleave.py
for audio in video) equal the thinker's ``get_rope_index`` exactly, and the audio-in-video token layout is the
processor's."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerModel
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

from pipeline.models.qwen3_omni.audio_encoder import EncoderWindows
from pipeline.models.qwen3_omni.av_interleave import Qwen3OmniAVLayout, Qwen3OmniAVTiming
from pipeline.models.qwen3_omni.positions import GridSpan, rope_positions, rope_shift, vision_offsets

PPS = 13  # the released position_id_per_seconds


@pytest.fixture(scope="module")
def thinker() -> Qwen3OmniMoeThinkerModel:
    """A tiny thinker (its ``get_rope_index`` is the reference) with the released time constants and merge size."""
    config = Qwen3OmniMoeThinkerConfig(
        audio_config=dict(
            d_model=16,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=16,
            downsample_hidden_size=4,
            output_dim=32,
            n_window=50,
            n_window_infer=800,
        ),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=16,
            num_heads=2,
            out_hidden_size=32,
            spatial_merge_size=2,
            deepstack_visual_indexes=[0],
        ),
        text_config=dict(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=32,
            moe_intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            num_experts=2,
            num_experts_per_tok=1,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        ),
        position_id_per_seconds=PPS,
        audio_token_id=10,
        image_token_id=11,
        video_token_id=12,
        vision_start_token_id=13,
        vision_end_token_id=14,
        audio_start_token_id=15,
        audio_end_token_id=16,
    )
    return Qwen3OmniMoeThinkerModel(config).eval()


@dataclass
class Prompt:
    """A rendered prompt as the engine renders one: token ids, the explicit-position spans, and what the reference
    needs besides (grids, seconds per grid, each audio's mel frames)."""

    config: Qwen3OmniMoeThinkerConfig
    ids: list[int] = field(default_factory=list)
    spans: list[GridSpan] = field(default_factory=list)
    images: list[tuple[int, int, int]] = field(default_factory=list)
    videos: list[tuple[int, int, int]] = field(default_factory=list)
    second_per_grid: list[float] = field(default_factory=list)
    audio_frames: list[int] = field(default_factory=list)

    @property
    def merge(self) -> int:
        return self.config.vision_config.spatial_merge_size

    def audio_tokens(self, frames: int) -> int:
        return EncoderWindows.of(self.config.audio_config).tokens(frames)

    def text(self, n: int) -> Prompt:
        self.ids += [20 + (len(self.ids) + i) % 40 for i in range(n)]
        return self

    def audio(self, frames: int) -> Prompt:
        c = self.config
        self.ids += [c.audio_start_token_id, *[c.audio_token_id] * self.audio_tokens(frames), c.audio_end_token_id]
        self.audio_frames.append(frames)
        return self

    def image(self, grid_h: int, grid_w: int) -> Prompt:
        return self._vision(1, grid_h, grid_w, self.config.image_token_id, t_step=PPS, images=True)

    def video(self, grid_t: int, grid_h: int, grid_w: int, second_per_grid: float) -> Prompt:
        self.second_per_grid.append(second_per_grid)
        step = Qwen3OmniAVTiming(PPS, second_per_grid).patch_step
        return self._vision(grid_t, grid_h, grid_w, self.config.video_token_id, t_step=step, images=False)

    def _vision(self, grid_t: int, grid_h: int, grid_w: int, token: int, *, t_step: int, images: bool) -> Prompt:
        offsets = vision_offsets(grid_t, grid_h, grid_w, merge=self.merge, t_step=t_step)
        self.ids.append(self.config.vision_start_token_id)
        self.spans.append(GridSpan(at=len(self.ids), offsets=offsets))
        self.ids += [token] * offsets.shape[1] + [self.config.vision_end_token_id]
        (self.images if images else self.videos).append((grid_t, grid_h, grid_w))
        return self

    def video_with_audio(self, grid_t: int, grid_h: int, grid_w: int, second_per_grid: float, frames: int) -> Prompt:
        c = self.config
        layout = self.av_layout(grid_t, grid_h, grid_w, second_per_grid, frames)
        self.spans.append(GridSpan(at=len(self.ids), offsets=layout.offsets(), advance=layout.advance))
        self.ids += layout.token_ids(
            vision_start=c.vision_start_token_id,
            audio_start=c.audio_start_token_id,
            video=c.video_token_id,
            audio=c.audio_token_id,
            audio_end=c.audio_end_token_id,
            vision_end=c.vision_end_token_id,
        )
        self.videos.append((grid_t, grid_h, grid_w))
        self.second_per_grid.append(second_per_grid)
        self.audio_frames.append(frames)
        return self

    def av_layout(
        self, grid_t: int, grid_h: int, grid_w: int, second_per_grid: float, frames: int
    ) -> Qwen3OmniAVLayout:
        rows, cols = grid_h // self.merge, grid_w // self.merge
        timing = Qwen3OmniAVTiming(PPS, second_per_grid)
        return Qwen3OmniAVLayout(timing, rows=rows, cols=cols, n_patches=grid_t, n_audio=self.audio_tokens(frames))


def reference(thinker, prompt: Prompt, *, audio_in_video: bool) -> tuple[np.ndarray, int]:
    """``get_rope_index``'s (3, L) positions (checked integral) and its rope delta for the decode steps."""
    grids = {
        "image_grid_thw": torch.tensor(prompt.images) if prompt.images else None,
        "video_grid_thw": torch.tensor(prompt.videos) if prompt.videos else None,
    }
    positions, delta = thinker.get_rope_index(
        torch.tensor([prompt.ids]),
        attention_mask=torch.ones(1, len(prompt.ids), dtype=torch.long),
        use_audio_in_video=audio_in_video,
        audio_seqlens=torch.tensor(prompt.audio_frames) if prompt.audio_frames else None,
        second_per_grids=torch.tensor(prompt.second_per_grid) if prompt.second_per_grid else None,
        **grids,
    )
    positions = positions[:, 0]
    assert torch.equal(positions, positions.round())
    return positions.long().numpy(), int(delta.flatten()[0])


def ours(prompt: Prompt) -> np.ndarray:
    n = len(prompt.ids)
    rope = rope_positions(n, prompt.spans)
    return np.broadcast_to(np.arange(n), (3, n)) if rope is None else rope


def check(thinker, prompt: Prompt, *, audio_in_video: bool = False) -> None:
    """Positions equal, the decode shift equals the reference's delta, and chunked prefills (cut anywhere, inside
    spans too) see the same positions."""
    want, delta = reference(thinker, prompt, audio_in_video=audio_in_video)
    got = ours(prompt)
    np.testing.assert_array_equal(got, want)
    n = len(prompt.ids)
    assert rope_shift(prompt.spans, n) == delta
    for chunk in (7, 64):
        pieces = []
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            rope = rope_positions(end, prompt.spans, start=start)  # None: the cache index
            pieces.append(np.broadcast_to(np.arange(start, end), (3, end - start)) if rope is None else rope)
        np.testing.assert_array_equal(np.concatenate(pieces, axis=1), want)


def chat(thinker) -> Prompt:
    return Prompt(thinker.config).text(9)  # a system message


# --- text, audio, pictures --------------------------------------------------------------------------------------


def test_text_and_audio_alone_run_at_the_cache_index(thinker):
    """Without pictures every axis is the cache index: the engine passes no explicit positions."""
    check(thinker, chat(thinker).text(5))
    prompt = chat(thinker).text(3).audio(450).text(6).text(4).audio(1234).text(3)
    assert rope_positions(len(prompt.ids), prompt.spans) is None
    check(thinker, prompt)


@pytest.mark.parametrize("grid", [(2, 2), (4, 6), (12, 4), (6, 30)])
def test_an_image(thinker, grid):
    check(thinker, chat(thinker).text(4).image(*grid).text(7))


def test_multi_turn_with_two_audio_messages_and_a_picture(thinker):
    prompt = (
        chat(thinker)
        .text(3).audio(450).text(2)  # user: speech
        .text(3).text(8).text(2)  # assistant: a reply
        .text(3).image(6, 8).text(5).text(2)  # user: a picture and a question
        .text(3).text(6).text(2)  # assistant
        .text(3).audio(1234).text(2)  # user: speech again
        .text(3)  # assistant, to be generated
    )  # fmt: skip
    check(thinker, prompt)


@pytest.mark.parametrize("spg", [1.0, 2.0])
def test_a_video_without_audio(thinker, spg):
    check(thinker, chat(thinker).text(3).video(3, 4, 6, spg).text(4).image(4, 4).text(2).audio(300).text(3))


# --- audio in video ---------------------------------------------------------------------------------------------

AV_CASES = {
    "audio longer": (2, 4, 4, 2.0, 700),
    "video longer": (5, 4, 6, 1.0, 150),
    # 27 tokens, the last patch at time 26: the tie puts the patch first, the audio ends the message (close 29, not
    # the 32 the tall grid's rows would give)
    "audio ends on the last patch's time": (3, 60, 4, 1.0, 201),
    "audio ends just before it": (3, 60, 4, 1.0, 200),  # 26 tokens: the last patch ends the message
    "tall grid ends the message": (2, 40, 8, 1.0, 100),  # the close marker follows the grid's rows
    "one patch": (1, 6, 6, 2.0, 333),
    "8 s of both": (8, 4, 4, 1.0, 800),
}


@pytest.mark.parametrize("case", AV_CASES.values(), ids=AV_CASES.keys())
def test_a_spoken_message_with_video(thinker, case):
    check(thinker, chat(thinker).text(3).video_with_audio(*case).text(5), audio_in_video=True)


def test_multi_turn_with_audio_in_video_audio_and_a_picture(thinker):
    prompt = (
        chat(thinker)
        .text(3).audio(450).text(2)
        .text(3).text(5).text(2)
        .text(3).video_with_audio(4, 4, 6, 1.0, 430).text(2)
        .text(3).text(4).text(2)
        .text(3).image(4, 6).text(3).text(2)
        .text(3).video_with_audio(2, 8, 4, 2.0, 1000).text(2)
        .text(3)
    )  # fmt: skip
    check(thinker, prompt, audio_in_video=True)


@pytest.mark.parametrize("case", AV_CASES.values(), ids=AV_CASES.keys())
def test_the_layout_is_the_processors(thinker, case):
    """The media tokens' order is ``Qwen3OmniMoeProcessor.replace_video_with_audio_token``'s."""
    grid_t, grid_h, grid_w, spg, frames = case
    prompt = Prompt(thinker.config)
    layout = prompt.av_layout(grid_t, grid_h, grid_w, spg, frames)
    processor = SimpleNamespace(
        audio_bos_token="(", audio_eos_token=")", video_token="v", audio_token="a",
        video_processor=SimpleNamespace(merge_size=prompt.merge),
    )  # fmt: skip
    expected = Qwen3OmniMoeProcessor.replace_video_with_audio_token(
        processor,
        {"video_grid_thw": [np.array([grid_t, grid_h, grid_w])], "video_second_per_grid": [spg]},
        0,
        {"num_audio_tokens": [layout.n_audio]},
        0,
        position_id_per_seconds=Qwen3OmniMoeProcessor.position_id_per_seconds,
    )
    ids = layout.token_ids(vision_start=0, audio_start=1, video=2, audio=3, audio_end=4, vision_end=5)
    assert "".join("(va)"[i - 1] for i in ids[1:-1]) == expected


def test_open_layouts_are_prefixes_of_the_closed_one():
    """As patches and audio arrive (in any interleaving), the ready chunks of every open layout, their tokens and
    offsets, are those of the closed message's layout: what the engine prefills early never changes."""
    rng = random.Random(0)
    for spg, rows, cols in [(1.0, 2, 3), (2.0, 1, 1), (1.0, 20, 2)]:
        timing = Qwen3OmniAVTiming(PPS, spg)
        for _ in range(20):
            n_patches, n_audio = rng.randint(1, 7), rng.randint(0, 120)
            final = Qwen3OmniAVLayout(timing, rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio)
            closed = final.offsets()
            assert final.ready_chunks(video_closed=True, audio_closed=True) == final.n_chunks
            p = a = 0
            while (p, a) != (n_patches, n_audio):
                if a == n_audio or (p < n_patches and rng.random() < 0.3):
                    p += 1
                else:
                    a = min(n_audio, a + rng.randint(1, 9))
                layout = Qwen3OmniAVLayout(timing, rows=rows, cols=cols, n_patches=p, n_audio=a)
                for flags in ((False, False), (p == n_patches, False), (False, a == n_audio)):
                    ready = layout.ready_chunks(video_closed=flags[0], audio_closed=flags[1])
                    assert [layout.chunk(j) for j in range(ready)] == [final.chunk(j) for j in range(ready)]
                    prefix = layout.prefix_offsets(ready)
                    np.testing.assert_array_equal(prefix, closed[:, : prefix.shape[1]])


def test_patch_times_must_be_whole_positions():
    assert Qwen3OmniAVTiming(PPS, 2.0).patch_step == 26
    np.testing.assert_array_equal(Qwen3OmniAVTiming(PPS, 1.0).patch_times(4), [0, 13, 26, 39])
    with pytest.raises(ValueError, match="whole number"):
        Qwen3OmniAVTiming(PPS, 0.5)  # fps 4: 6.5 positions a patch
