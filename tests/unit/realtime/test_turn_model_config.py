"""The turn model's settings: ``serve``'s flags become ``ServerConfig.semantic_vad`` and ``.turn_model``, bad values
are one CLI error line, and the server applies them (threads to the bundled model, batch and queue to its scorer;
no model at all, said once)."""

from __future__ import annotations

import logging

import pytest

from realtime.cli.main import build_parser, main, server_config
from realtime.config import ServerConfig
from realtime.observe.metrics import ServerMetrics
from realtime.protocol.turn_detection import ServerVadParams
from realtime.server import turn_model as turn_model_module
from realtime.server.turn_model import TurnModelService, bundled_turn_model
from realtime.turns.model_settings import TurnModelSettings
from realtime.turns.semantic import SemanticVadConfig
from realtime.turns.smart_turn import TurnModel
from tests.helpers.scripted_vad import ScriptedVad


def test_turn_model_flags_become_the_server_config():
    args = build_parser().parse_args(
        [
            "serve",
            "--turn-model-threads",
            "2",
            "--turn-model-batch",
            "4",
            "--turn-model-queue",
            "32",
            "--semantic-score-after-ms",
            "160",
        ]
    )
    config = server_config(args)
    assert config.turn_model == TurnModelSettings(enabled=True, threads=2, max_batch=4, max_waiting=32)
    assert config.semantic_vad == SemanticVadConfig(score_after_ms=160)
    assert server_config(build_parser().parse_args(["serve", "--no-turn-model"])).turn_model.enabled is False


def test_without_the_flags_the_settings_keep_their_defaults():
    config = server_config(build_parser().parse_args(["serve"]))
    assert config.turn_model == ServerConfig().turn_model == TurnModelSettings()
    assert config.semantic_vad == ServerConfig().semantic_vad == SemanticVadConfig()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--turn-model-threads", "0"], "--turn-model-threads"),
        (["--turn-model-batch", "x"], "--turn-model-batch"),
        (["--turn-model-queue", "-1"], "--turn-model-queue"),
        (["--semantic-score-after-ms", "-5"], "--semantic-score-after-ms"),
    ],
)
def test_bad_turn_model_flags_are_one_error_line(flags, named, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", *flags])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_a_score_after_past_an_eagerness_wait_is_refused_before_the_model_loads(capsys):
    status = main(["serve", "--semantic-score-after-ms", "5000", "--port", "0"])
    err = capsys.readouterr().err
    assert status == 2 and "score_after_ms" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "change",
    [{"threads": 0}, {"max_batch": True}, {"max_waiting": 1.5}, {"enabled": "no"}],
)
def test_bad_settings_are_refused(change):
    with pytest.raises(ValueError, match="turn_model"):
        TurnModelSettings(**change)
    with pytest.raises(ValueError, match="turn_model"):
        ServerConfig(turn_model={"threads": 2})  # type: ignore[arg-type]


async def test_the_service_applies_the_settings(monkeypatch):
    threads = []
    monkeypatch.setattr(turn_model_module.SmartTurnModel, "bundled", classmethod(lambda cls, **kw: threads.append(kw)))
    settings = TurnModelSettings(threads=3, max_batch=2, max_waiting=5)
    service = TurnModelService(bundled_turn_model, ServerMetrics(), SemanticVadConfig(score_after_ms=96), settings)
    scorer = service.scorer
    assert scorer is not None and (scorer.max_batch, scorer.max_waiting) == (2, 5)
    scorer._load()  # what the scorer's thread calls to load the model
    assert threads == [{"threads": 3}]
    detector = service.detector(ServerVadParams.semantic("high"), ScriptedVad())
    assert detector.policy.score_after_ms == 96  # type: ignore[attr-defined]
    await service.close()


async def test_without_a_turn_model_semantic_sessions_end_turns_on_silence_and_the_log_says_so_once(caplog):
    def load() -> TurnModel:
        raise AssertionError("the model is off: never loaded")

    with caplog.at_level(logging.INFO, logger="realtime.server.turn_model"):
        service = TurnModelService(load, ServerMetrics(), settings=TurnModelSettings(enabled=False))
        detectors = [service.detector(ServerVadParams.semantic("auto"), ScriptedVad()) for _ in range(3)]
    said = [r for r in caplog.records if r.name == "realtime.server.turn_model" and "turn model is off" in r.message]
    assert len(said) == 1
    assert service.scorer is None and not any(d.model_available for d in detectors)  # type: ignore[attr-defined]
    await service.close()
