"""The engine's own counters on /metrics, copied from its stats."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from pipeline.response_events import EngineStats
from realtime.observe.metrics import EngineWorkCollector


def test_camera_video_held_and_dropped_are_exported():
    collector = EngineWorkCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    collector.stats = EngineStats(
        conversations=2,
        responses=0,
        open_audio_messages=1,
        cached_tokens=900,
        talker_cached_tokens=0,
        pending_commands=0,
        video_positions=468,
        video_frames_dropped_total=3,
    )
    text = generate_latest(registry).decode()
    assert "omni_realtime_engine_video_positions 468.0" in text
    assert "omni_realtime_engine_video_frames_dropped_total 3.0" in text
