"""Spoken messages with camera video as the engine tests stream them: noise speech with a click, random camera
frames at the model's 2 fps, and the way a caller sends them (audio in steps, each step's frame beside it)."""

from __future__ import annotations

import numpy as np

RATE = 16_000
STEP_S = 0.5
"""The tests' camera: one frame every 0.5 s (the model's 2 fps), with 0.5 s of audio."""


def speech(seconds: float, seed: int) -> np.ndarray:
    """Noise with a loud click first (so the log-mel floor is known from the first block on)."""
    rng = np.random.default_rng(seed)
    pcm = 0.1 * rng.standard_normal(int(seconds * RATE))
    pcm[:200] = 0.9
    return pcm.astype(np.float32)


def camera(n: int, seed: int, height: int = 100, width: int = 130) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(n)]


async def speak(engine, conv, item_id: str, clip, *, incremental: bool = True) -> None:
    """The message as a caller streams it: 0.5 s of audio then the frame seen at its start, the engine idle between
    steps (``incremental``: everything final is prefilled while speaking); else every frame, then all the audio."""
    pcm, frames = clip
    handle = conv.open_audio(item_id)
    step = int(STEP_S * RATE)
    if incremental:
        for k in range(-(-len(pcm) // step)):
            handle.append(pcm[k * step : (k + 1) * step])
            if frames is not None and k < len(frames):
                handle.add_video_frame(frames[k], k * STEP_S)
            await engine.wait_idle()
    else:
        for k, frame in enumerate(frames or []):
            handle.add_video_frame(frame, k * STEP_S)
        handle.append(pcm)
    await handle.commit()
