"""Latency benchmarks of a realtime server under concurrent simulated users (``omni-realtime bench``).

Modules: :mod:`.speech` (the spoken inputs: any WAV folder, speech bounds from a manifest or an
energy gate), :mod:`.client` (one simulated user over WebSocket or WebRTC, paced in real time),
:mod:`.metrics` (pure per-turn metrics and percentiles from timestamped observations),
:mod:`.sweep` (concurrency levels, users in a child process), :mod:`.reference` (transformers'
``generate`` on the same turns, one request at a time), :mod:`.throughput` (per-stage tokens/s and
device memory of a level, from the engine's counters), :mod:`.models` (model and forced reply
lengths), :mod:`.report` (JSON, Markdown, PNG plots), :mod:`.cli` (the subcommand).
"""
