"""The server's turn model for ``semantic_vad``: one :class:`~realtime.turns.smart_turn.TurnScorer` shared by every
session, and the detectors made over it.

Settings (:class:`~realtime.turns.model_settings.TurnModelSettings`, from ``ServerConfig.turn_model``): the
model's threads and the scorer's batch and queue limits; with ``enabled`` false no model is loaded and the server says
so once at startup (a log line); ``semantic_vad`` sessions then end turns on silence alone.

Loading: the model loads in the background when the first ``semantic_vad`` detector is made (on the scorer's thread,
never on the event loop; a server whose sessions all use ``server_vad`` never loads it), so a scoring request made
meanwhile waits for the load. A model that fails to load or to run breaks the scorer for good: the scorer logs one
warning and the ``turn_model_failures`` metric counts it; sessions then end turns on silence alone
(``unscored_wait_ms``), each such turn counted by ``turn_model_fallback_turns``; no session fails for it.

Ownership: :class:`TurnModelService` owns the scorer and its loading task; :meth:`TurnModelService.close` (the
server's shutdown) cancels the load and closes the scorer, whose waiting requests then raise
``TurnModelUnavailable`` (each session falls back as above).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from realtime.observe.metrics import ServerMetrics
from realtime.protocol.turn_detection import ServerVadParams
from realtime.turns.detection import SpeechDetector
from realtime.turns.model_settings import DEFAULT_THREADS, TurnModelSettings
from realtime.turns.semantic import SemanticVadConfig
from realtime.turns.semantic_detector import SemanticTurnDetector, TurnModelHooks
from realtime.turns.smart_turn import SmartTurnModel, TurnModel, TurnModelError, TurnScorer
from realtime.turns.vad import SpeechProbability

logger = logging.getLogger(__name__)

TurnModelLoader = Callable[[], TurnModel]
"""Loads the turn model (on the scorer's thread); raises ``TurnModelError`` (or anything) when it cannot."""


def bundled_turn_model(threads: int = DEFAULT_THREADS) -> TurnModel:
    """Smart Turn v3.2 as the ``pipecat-ai`` wheel ships it, on ``threads`` onnxruntime threads (the service passes
    its settings' ``threads``)."""
    return SmartTurnModel.bundled(threads=threads)


class TurnModelService:
    """The server's one turn scorer (``load`` ``None``, or ``settings.enabled`` false: no model; ``semantic_vad`` then
    ends turns on silence). ``load`` :func:`bundled_turn_model` runs on ``settings.threads``; the scorer batches and
    queues as ``settings`` say. Used on the server's event loop only."""

    def __init__(
        self,
        load: TurnModelLoader | None,
        metrics: ServerMetrics,
        config: SemanticVadConfig | None = None,
        settings: TurnModelSettings | None = None,
    ) -> None:
        self.config = config if config is not None else SemanticVadConfig()
        self.settings = settings if settings is not None else TurnModelSettings()
        self._metrics = metrics
        if not self.settings.enabled:
            load = None
            logger.info("semantic_vad sessions end turns on silence alone: the turn model is off (--no-turn-model)")
        elif load is bundled_turn_model:
            load = functools.partial(bundled_turn_model, threads=self.settings.threads)
        self._scorer = (
            TurnScorer(
                load,
                max_batch=self.settings.max_batch,
                max_waiting=self.settings.max_waiting,
                on_failure=self._failed,
                on_shed=metrics.turn_model_shed.inc,
            )
            if load is not None
            else None
        )
        self._loading: asyncio.Task[None] | None = None
        self._hooks = TurnModelHooks(
            answered=metrics.turn_model_latency.observe, fallback=metrics.turn_model_fallbacks.inc
        )

    @property
    def scorer(self) -> TurnScorer | None:
        """The scorer while it can score (None: no model, or it failed)."""
        if self._scorer is None or self._scorer.broken is not None:
            return None
        return self._scorer

    def detector(self, params: ServerVadParams, vad: SpeechProbability) -> SpeechDetector:
        """The ``semantic_vad`` detector of one session over its VAD; starts loading the model if it was not."""
        scorer = self.scorer
        if scorer is not None and self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load(scorer), name="turn-model-load")
        return SemanticTurnDetector(params, vad, scorer, config=self.config, hooks=self._hooks)

    async def close(self) -> None:
        """Stop loading and close the scorer (idempotent)."""
        if self._loading is not None:
            self._loading.cancel()
            await asyncio.wait({self._loading})
        if self._scorer is not None:
            self._scorer.close()

    async def _load(self, scorer: TurnScorer) -> None:
        try:
            await scorer.start()
        except TurnModelError:  # the scorer logged it once and counted it (on_failure); sessions fall back
            return
        logger.info("turn model loaded for semantic_vad")

    def _failed(self, error: TurnModelError) -> None:
        self._metrics.turn_model_failures.inc()
