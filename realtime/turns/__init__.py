"""Turn detection: when the user starts and stops speaking.

- ``server_vad``: :mod:`~realtime.turns.vad` (silero-vad's speech probability), scored for every session together by
  :mod:`~realtime.turns.vad_batch`; :mod:`~realtime.turns.server_vad` turns the probabilities into speech started /
  paused / resumed / stopped events after a silence length; :mod:`~realtime.turns.idle` is its idle timeout.
- ``semantic_vad``: :mod:`~realtime.turns.semantic_detector` asks the turn model
  (:mod:`~realtime.turns.smart_turn`, Smart Turn v3.2 on onnxruntime, its features in
  :mod:`~realtime.turns.features`, its settings in :mod:`~realtime.turns.model_settings`) about the audio of the turn
  (:mod:`~realtime.turns.turn_audio`) after a short silence, and :mod:`~realtime.turns.semantic` (pure) decides from
  its answer and the eagerness when the turn ends.
- :mod:`~realtime.turns.detection`: one session's speech detection as the runner drives it, whichever detector.
"""
