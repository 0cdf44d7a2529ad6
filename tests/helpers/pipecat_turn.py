"""pipecat's own Smart Turn v3 analyzer (``LocalSmartTurnAnalyzerV3``) scoring turns, in a process of its own.

A separate process: importing ``pipecat`` pulls in its dependencies and logging setup, and the server's code must
be seen to load the model without it (``test_the_bundled_model_is_found_without_importing_pipecat``).

The analyzer is driven through its public path as a pipecat pipeline drives it: 20 ms frames of 16 kHz int16 PCM
through ``append_audio`` (``is_speech`` while the turn's speech lasts, then its trailing silence), then
``analyze_end_of_turn``; its metrics carry the probability. The analyzer converts int16 to float with ``/ 32768``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RATE = 16_000
FRAME = RATE * 20 // 1000


def pipecat_probabilities(turns: list[tuple[np.ndarray, int, int]]) -> np.ndarray:
    """P(complete) by pipecat's analyzer for each ``(int16 audio, speech start, speech end)`` (the bounds in samples:
    the frames between them are marked speech, those before and after silence).

    Raises ``ImportError`` (from the child) when pipecat's analyzer cannot be imported here."""
    with tempfile.TemporaryDirectory(prefix="pipecat-turn-") as tmp:
        path = Path(tmp) / "turns.npz"
        np.savez(path, *[audio for audio, _, _ in turns], speech=np.array([bounds for _, *bounds in turns]))
        done = subprocess.run([sys.executable, __file__, str(path)], capture_output=True, text=True, timeout=300)
    if done.returncode == 3:
        raise ImportError(done.stderr.strip().splitlines()[-1])
    if done.returncode != 0:
        raise RuntimeError(f"pipecat's analyzer failed ({done.returncode}): {done.stderr[-2000:]}")
    return np.array(json.loads(done.stdout.strip().splitlines()[-1]), dtype=np.float64)


async def _score(path: Path) -> list[float]:
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    data = np.load(path)
    speech = data["speech"]
    analyzer = LocalSmartTurnAnalyzerV3(cpu_count=1)
    analyzer.set_sample_rate(RATE)
    probabilities = []
    for i, (speech_start, speech_end) in enumerate(speech):
        audio = data[f"arr_{i}"]
        for start in range(0, len(audio), FRAME):
            is_speech = bool(speech_start <= start < speech_end)
            analyzer.append_audio(audio[start : start + FRAME].tobytes(), is_speech=is_speech)
        _, metrics = await analyzer.analyze_end_of_turn()
        probabilities.append(float(metrics.probability))
        analyzer.clear()
    await analyzer.cleanup()
    return probabilities


def main() -> None:
    try:
        import pipecat.audio.turn.smart_turn.local_smart_turn_v3  # noqa: F401
    except ImportError as exc:
        print(f"pipecat's Smart Turn v3 analyzer cannot be imported: {exc!r}", file=sys.stderr)
        raise SystemExit(3) from exc
    print(json.dumps(asyncio.run(_score(Path(sys.argv[1])))))


if __name__ == "__main__":
    main()
