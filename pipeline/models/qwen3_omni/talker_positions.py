"""Rope positions of the Qwen3-Omni talker: its prompt's (three axes per position) and its decode steps'.

The reference computes the talker's prefill positions with ``get_rope_index`` over the *talker's own* sequence (the
user-role thinker ids, then tts_pad x 9 for the assistant part; :mod:`pipeline.models.qwen3_omni.talker`), not the
thinker's: system turns and earlier replies are absent, so a talker position's index differs from its thinker
position's. Text and audio positions advance by one on every axis; the image or video tokens after a
``vision_start`` take 3-D positions (time, row, column) from the next position on, and the text after them continues
at their largest position + 1. Without pictures or video every axis equals the talker's cache index.

Decode step ``n`` (after a prefill of ``P`` positions) is at ``P + n + delta`` on every axis, ``delta`` = the
prompt's largest position + 1 - ``P`` (0 without pictures or video): ``generate`` adds one per step to the prompt's
last position. Positions are float32, as the reference's are: a video whose seconds per temporal patch times
``position_id_per_seconds`` is not whole has fractional positions. Audio inside a video (``use_audio_in_video``) is
refused: the reference's talker is never told of it, so its positions for such a prompt are not a layout to match.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.errors import UnsupportedInputError
from pipeline.models.qwen3_omni.talker import TalkerTokens

__all__ = ["decode_position", "prompt_positions"]


def prompt_positions(
    ids: Sequence[int],
    tokens: TalkerTokens,
    *,
    image_grids: Sequence[Sequence[int]] = (),
    video_grids: Sequence[Sequence[int]] = (),
    video_seconds: Sequence[float] = (),
) -> tuple[torch.Tensor, float]:
    """((3, P) float32 rope positions, delta) of the talker prompt ``ids``: ``image_grids`` / ``video_grids``
    (t, h, w) of the vision tower's patches and ``video_seconds`` (seconds per temporal patch) for the pictures and
    videos in ``ids``, in order."""
    ids = list(ids)
    merge = tokens.spatial_merge_size
    parts: list[torch.Tensor] = []
    nxt = torch.tensor(0.0)
    i = images = videos = 0
    while i < len(ids):
        tok = ids[i]
        opens = i > 0 and ids[i - 1] == tokens.vision_start
        if tok == tokens.audio_start and opens:
            raise UnsupportedInputError("the talker's positions for audio inside a video are not supported")
        if opens and tok in (tokens.image, tokens.video):
            if tok == tokens.image:
                grid, seconds = image_grids[images], None
                images += 1
            else:
                grid, seconds = video_grids[videos], video_seconds[videos]
                videos += 1
            span = _grid_positions(grid, merge, seconds, tokens.position_id_per_seconds) + nxt
            n = span.shape[1]
            if ids[i : i + n] != [tok] * n:
                raise UnsupportedInputError(f"position {i}: expected {n} placeholder tokens for the grid {grid}")
            parts.append(span)
            nxt = span.max() + 1
            i += n
        else:
            parts.append((torch.zeros(3, 1) + nxt).float())
            nxt = nxt + 1
            i += 1
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0)
    delta = float(positions.max()) + 1 - len(ids) if len(ids) else 0.0
    return positions, delta


def _grid_positions(grid: Sequence[int], merge: int, seconds: float | None, per_second: float) -> torch.Tensor:
    """(3, n) positions of a picture's (``seconds`` None) or a video's tokens from 0, computed in the reference's
    float32 order."""
    t, h, w = (int(v) for v in grid)
    rows, cols = h // merge, w // merge
    if seconds is None:
        t_index = (torch.arange(t) * 1 * per_second).float()
    else:
        t_index = (torch.arange(t) * torch.tensor(float(seconds)).float() * per_second).float()
    hh = torch.arange(rows).view(1, -1, 1).expand(t, -1, cols).flatten().float()
    ww = torch.arange(cols).view(1, 1, -1).expand(t, rows, -1).flatten().float()
    tt = t_index.view(-1, 1).expand(-1, rows * cols).flatten()
    return torch.stack([tt, hh, ww])


def decode_position(prompt_len: int, delta: float, step: int) -> float:
    """The rope position (every axis) of decode step ``step`` (0 = the first after the prefill)."""
    return prompt_len + step + delta
