"""A spoken message's camera frames on the model's frame grid: which frame each video slot shows, and how many
temporal patches (frame pairs) are final while the message is still being spoken.

Time ``t`` is seconds since the message's first audio sample. Slot ``s`` is ``[s / fps, (s + 1) / fps)``; temporal
patch ``i`` is slots ``i * tp .. i * tp + tp - 1`` (``tp`` = the tower's temporal patch size). Rules:

- A frame fills the slot its ``t`` falls in; the first frame of a slot is kept, a second one is dropped.
- The video starts at the message's start: slots before the first frame show the first frame. Every other empty slot
  shows the frame of the nearest earlier filled slot (a late or lost frame repeats the previous one).
- The video ends after the last patch that has a frame. While the message is open, a patch with no frame once the
  audio has run ``grace_s`` seconds past its end ends the video there (the camera stopped or fell too far behind):
  later frames of the message are dropped. At commit, frames at or after the audio's end are dropped, and the last
  patch is completed by repeating its last frame.
- A frame for a slot of a patch already final (:meth:`VideoTimeline.final_patches`), or after the video ended, is
  dropped. Dropped frames are counted (:attr:`VideoTimeline.dropped`).

Pure: numpy arrays in, references to them out; no model work.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["VideoTimeline"]


class VideoTimeline:
    def __init__(self, *, fps: float, temporal_patch_size: int, grace_s: float) -> None:
        if fps <= 0 or temporal_patch_size <= 0 or grace_s < 0:
            raise ValueError(f"bad video timeline: fps {fps}, temporal patch {temporal_patch_size}, grace {grace_s}")
        self.fps, self.tp, self.grace_s = fps, temporal_patch_size, grace_s
        self._frames: dict[int, np.ndarray] = {}
        self._final = 0
        """Patches before this one are final (handed out; never change)."""
        self._end: int | None = None
        """The video's patch count once it has ended (None: open)."""
        self.dropped = 0

    # -- input ----------------------------------------------------------------------------------
    def slot(self, t: float) -> int:
        return math.floor(t * self.fps + 1e-9)

    def add(self, frame: np.ndarray, t: float) -> bool:
        """Place a frame seen at ``t`` (>= 0); False (and counted) when a rule of the module drops it."""
        s = self.slot(max(t, 0.0))
        if s in self._frames or s // self.tp < self._final or (self._end is not None and s // self.tp >= self._end):
            self.dropped += 1
            return False
        self._frames[s] = frame
        return True

    @property
    def has_video(self) -> bool:
        return bool(self._frames)

    @property
    def ended(self) -> bool:
        """No patch will be added any more (the video ended by the grace rule, or the message is closed)."""
        return self._end is not None

    # -- patches --------------------------------------------------------------------------------
    def final_patches(self, audio_s: float, *, closed: bool) -> int:
        """Temporal patches that are final with ``audio_s`` seconds of audio heard (``closed``: the message is
        committed and ``audio_s`` is its length). 0 while the message has no frame. A patch once reported final stays
        so: later calls return at least as many; once closed, exactly the video's length."""
        if closed and self._end is None:
            end_slot = math.ceil(audio_s * self.fps - 1e-9)
            late = [s for s in self._frames if s >= end_slot and s // self.tp >= self._final]
            for s in late:
                del self._frames[s]
            self.dropped += len(late)
            self._end = max(self._final, max(self._frames) // self.tp + 1) if self._frames else self._final
        if not self._frames:
            return 0
        last = max(self._frames)
        if self._end is None and audio_s >= (last // self.tp + 2) * self.tp / self.fps + self.grace_s:
            self._end = last // self.tp + 1  # the patch after the last frame is over by grace_s and has none
        n = self._end if self._end is not None else (last + 1) // self.tp
        self._final = max(self._final, n)
        return self._final

    def patch_frames(self, i: int) -> list[np.ndarray]:
        """The ``tp`` frames of temporal patch ``i`` by the fill rule (needs a frame in the message)."""
        if not self._frames:
            raise ValueError("the message has no video frame")
        first = min(self._frames)
        out = []
        for s in range(i * self.tp, (i + 1) * self.tp):
            filled = [k for k in self._frames if k <= s]
            out.append(self._frames[max(filled)] if filled else self._frames[first])
        return out
