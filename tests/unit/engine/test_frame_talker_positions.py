"""The frame talker's rope positions (pipeline/step/frame_talker_stage.py): the thinker's explicit-position spans of
the positions the talker reads, placed on the talker's own sequence (:func:`subsequence_spans`), give through the
family's position scheme exactly Qwen3-Omni's talker positions (``talker_positions.prompt_positions``, itself equal to
transformers' ``get_rope_index`` over the talker's ids), over several turns with pictures and audio."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.models.common.tmrope import TMROPE
from pipeline.models.positions import GridSpan
from pipeline.models.qwen3_omni.talker import TalkerTokens, user_mask
from pipeline.models.qwen3_omni.talker_positions import prompt_positions
from pipeline.step.frame_talker_stage import subsequence_spans
from tests.helpers.qwen3_tiny_config import TINY_IDS as I
from tests.helpers.qwen3_tiny_config import tiny_qwen3_config

MERGE = 2


def span(at: int, n: int) -> GridSpan:
    return GridSpan(at=at, offsets=np.zeros((3, n), dtype=np.int64))


def test_spans_move_to_the_indices_of_their_positions_in_the_subsequence():
    picked = [0, 1, 5, 6, 7, 8, 12, 13]
    placed = subsequence_spans([span(2, 2), span(5, 3), span(12, 4)], picked, length=14)
    assert [(s.at, s.length) for s in placed] == [(2, 3), (6, 4)], "unread span left out; a cut span kept whole"
    assert subsequence_spans([span(14, 2)], picked, length=14) == [], "a span past the length is not there yet"


def test_a_span_read_only_in_part_is_refused():
    with pytest.raises(ValueError, match="partly"):
        subsequence_spans([span(4, 3)], [0, 5, 6], length=8)
    with pytest.raises(ValueError, match="partly"):
        subsequence_spans([span(4, 3)], [0, 4, 6], length=8)


def _turn(role: int, body: list) -> list:
    return [I.im_start, role, I.newline, *body, I.im_end, I.newline]


def _picture(grid: tuple[int, int, int]) -> list:
    return [I.vision_start, *[("image", grid)] * (grid[0] * grid[1] * grid[2] // MERGE**2), I.vision_end]


def test_talker_positions_of_a_conversation_with_pictures_equal_the_familys():
    """System, a user turn with text and two pictures, a reply, a user turn with audio and a picture, the reply's
    header: the positions of the talker's sequence equal ``prompt_positions`` of its ids."""
    grids = [(1, 4, 6), (1, 6, 4), (1, 2, 8)]
    audio = [I.audio_start, *[I.audio] * 7, I.audio_end]
    rendering = _turn(I.system, [20, 21])
    rendering += _turn(I.user, [30, *_picture(grids[0]), 31, *_picture(grids[1]), 32])
    rendering += _turn(I.assistant, [40, 41, 42])
    rendering += _turn(I.user, [*audio, *_picture(grids[2]), 33])
    rendering += [I.im_start, I.assistant, I.newline]
    ids = [I.image if isinstance(t, tuple) else t for t in rendering]
    spans, k = [], 0
    for at, t in enumerate(rendering):
        if isinstance(t, tuple) and not isinstance(rendering[at - 1], tuple):
            spans.append(GridSpan(at=at, offsets=TMROPE.image_offsets(grids[k], merge=MERGE)))
            k += 1
    tokens = TalkerTokens.of(tiny_qwen3_config())
    picked = torch.nonzero(user_mask(torch.tensor(ids), tokens)).flatten().tolist()
    talker_ids = [ids[i] for i in picked]

    placed = subsequence_spans(spans, picked, len(rendering))
    ours = TMROPE.rope_positions(len(picked), placed)
    want, delta = prompt_positions(talker_ids, tokens, image_grids=grids)
    np.testing.assert_array_equal(ours, want.numpy())
    assert TMROPE.rope_shift(placed, len(picked)) == delta < 0
    assert talker_ids[6:8] == [I.image, I.image] and talker_ids[16] == I.image
    for start in (7, 16, len(picked) - 3):  # a chunk's positions from inside either picture, and the last text
        np.testing.assert_array_equal(TMROPE.rope_positions(len(picked), placed, start=start), want.numpy()[:, start:])
