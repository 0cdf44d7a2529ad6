"""The audio-in-video layout and 3-D positions (pipeline/models/qwen2_5_omni/av_interleave.py) against transformers'
``get_rope_index(..., use_audio_in_video=True)`` and the processor's placeholder layout, exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from transformers import Qwen2_5OmniThinkerForConditionalGeneration

from pipeline.models.qwen2_5_omni.av_interleave import Qwen25OmniAVLayout, Qwen25OmniAVTiming, token_chunks
from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec, build_config


@pytest.fixture(scope="module")
def reference():
    config = build_config(Qwen25OmniRandomModelSpec()).thinker_config
    with torch.device("meta"):
        return Qwen2_5OmniThinkerForConditionalGeneration(config)


def _ids(cfg) -> dict[str, int]:
    return dict(
        vision_start=cfg.vision_start_token_id,
        audio_start=cfg.audio_start_token_id,
        video=cfg.video_token_id,
        audio=cfg.audio_token_id,
        audio_end=cfg.audio_end_token_id,
        vision_end=cfg.vision_end_token_id,
    )


def _timing(cfg, second_per_grid: float) -> Qwen25OmniAVTiming:
    return Qwen25OmniAVTiming(cfg.position_id_per_seconds, cfg.seconds_per_chunk, second_per_grid)


def _reference_positions(reference, ids, messages, second_per_grid):
    """Text, AV message, text, ... through transformers; returns (input_ids, positions (3, L))."""
    text = [11, 12, 13]
    input_ids, grids, seqlens = list(text), [], []
    for rows, cols, n_patches, n_audio in messages:
        layout = Qwen25OmniAVLayout(
            _timing(reference.config, second_per_grid), rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio
        )
        input_ids += layout.token_ids(**ids) + text
        grids.append([n_patches, 2 * rows, 2 * cols])
        seqlens.append(4 * n_audio)  # mel frames the encoder turns into n_audio tokens
    pos, _ = reference.get_rope_index(
        torch.tensor([input_ids]),
        None,
        torch.tensor(grids),
        None,
        use_audio_in_video=True,
        audio_seqlens=torch.tensor(seqlens),
        second_per_grids=torch.tensor([second_per_grid] * len(messages)),
    )
    return input_ids, pos[:, 0].numpy()


def _our_positions(timing, messages):
    out, p = [np.arange(3)], 3
    for rows, cols, n_patches, n_audio in messages:
        layout = Qwen25OmniAVLayout(timing, rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio)
        out.append(layout.offsets() + p)
        p += layout.advance
        out.append(np.broadcast_to(np.arange(p, p + 3), (3, 3)))
        p += 3
    return np.concatenate([np.broadcast_to(o, (3, o.shape[-1])) for o in out], axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("second_per_grid", [1.0, 0.5, 2.0, 4.0, 1.2])
def test_positions_equal_get_rope_index(reference, second_per_grid):
    """Audio of many lengths (under, at and over chunk boundaries, shorter and longer than the video), 1 to 9 temporal
    patches, grids taller than the audio is long; two messages with text around them."""
    ids = _ids(reference.config)
    timing = _timing(reference.config, second_per_grid)
    cases = list(itertools.product([(1, 1), (2, 3), (9, 4)], [1, 2, 3, 4, 5, 9], [1, 7, 49, 50, 51, 99, 100, 163]))
    for (rows, cols), n_patches, n_audio in cases:
        messages = [(rows, cols, n_patches, n_audio), (cols, rows, max(1, n_patches - 1), n_audio + 13)]
        input_ids, expected = _reference_positions(reference, ids, messages, second_per_grid)
        ours = _our_positions(timing, messages)
        assert ours.shape == expected.shape, (rows, cols, n_patches, n_audio)
        np.testing.assert_array_equal(ours, expected, err_msg=f"{rows}x{cols}, {n_patches} patches, {n_audio} audio")


def test_close_marker_follows_the_last_block_not_the_largest_position(reference):
    """A short last audio chunk after a video whose positions run further: the reference closes after the audio (the
    text after the message then overlaps the video's positions); so do we."""
    timing = _timing(reference.config, 1.0)
    layout = Qwen25OmniAVLayout(timing, rows=9, cols=4, n_patches=4, n_audio=60)
    assert layout.offsets().max() == 1 + 75  # the last patch's time
    assert layout.close_offset == 1 + 59 + 1


def test_token_layout_equals_the_processor(reference):
    """The processor's placeholder string (video chunk then audio chunk, per chunk) for the same message."""
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor

    cfg = reference.config
    for spg, n_patches, n_audio in [(1.0, 5, 137), (1.0, 2, 220), (0.5, 9, 60), (4.0, 3, 20)]:
        rows, cols = 3, 2
        processor = Qwen2_5OmniProcessor.__new__(Qwen2_5OmniProcessor)
        processor.audio_bos_token, processor.audio_eos_token = "B", "E"
        processor.video_token, processor.audio_token = "V", "A"
        processor.video_processor = type("VP", (), {"merge_size": 2})()
        text = processor.replace_video_with_audio_token(
            {"video_grid_thw": [[n_patches, 2 * rows, 2 * cols]], "video_second_per_grid": [spg]},
            0,
            {"num_audio_tokens": [n_audio]},
            0,
            position_id_per_seconds=cfg.position_id_per_seconds,
            seconds_per_chunk=cfg.seconds_per_chunk,
        )
        layout = Qwen25OmniAVLayout(_timing(cfg, spg), rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio)
        ours = "".join("V" * len(c.video) + "A" * len(c.audio) for c in layout.chunks())
        assert text == "B" + ours + "E", (spg, n_patches, n_audio)


def test_chunks_are_final_once_ready():
    """Built as media arrive (patches and audio tokens growing in steps), every chunk a layout calls ready has the same
    tokens and offsets in the closed message's layout; at 2 fps chunk j is patches 2j, 2j+1 and audio 50j.."""
    timing = Qwen25OmniAVTiming(25, 2, 1.0)
    final = Qwen25OmniAVLayout(timing, rows=2, cols=3, n_patches=7, n_audio=163)
    assert [len(c.video) // 6 for c in final.chunks()] == [2, 2, 2, 1]
    assert [len(c.audio) for c in final.chunks()] == [50, 50, 50, 13]
    seen = 0
    for n_patches, n_audio in [(0, 0), (1, 30), (2, 50), (3, 50), (3, 100), (5, 120), (6, 150), (7, 163)]:
        closed = (n_patches, n_audio) == (7, 163)
        layout = Qwen25OmniAVLayout(timing, rows=2, cols=3, n_patches=n_patches, n_audio=n_audio)
        ready = layout.ready_chunks(video_closed=closed, audio_closed=closed)
        for j in range(ready):
            assert layout.chunk(j) == final.chunk(j)
            np.testing.assert_array_equal(layout.chunk_offsets(j), final.chunk_offsets(j))
        prefix = layout.prefix_offsets(ready)  # the open message's rendering: a prefix of the closed one's
        np.testing.assert_array_equal(prefix, final.offsets()[:, : prefix.shape[1]])
        assert ready >= seen
        seen = ready
    assert seen == final.n_chunks
    partial = Qwen25OmniAVLayout(timing, rows=2, cols=3, n_patches=2, n_audio=50)
    assert partial.ready_chunks(video_closed=False, audio_closed=False) == 1
    assert (
        Qwen25OmniAVLayout(timing, rows=2, cols=3, n_patches=1, n_audio=50).ready_chunks(
            video_closed=False, audio_closed=False
        )
        == 0
    )


def test_token_chunks_cut_at_most_once_per_token():
    """Values more than a chunk apart: one boundary per token (the reference's rule), not one per time chunk."""
    assert token_chunks(np.array([0, 0, 120, 120, 240]), 50).tolist() == [0, 0, 1, 2, 3]
    assert token_chunks(np.array([0, 25, 50, 75, 100]), 50).tolist() == [0, 0, 1, 1, 2]
