"""Queued audio encodes: blocks are allocated at once and filled by the step's one batched encode; a failing batch
is retried block by block; a block that cannot be encoded fails the response that reads it, not the engine."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from pipeline.runners.audio_encodes import AudioEncodes
from tests.helpers.runners import thinker_runner


class FakeEncoder:
    """Encodes T frames to T // 4 rows of the value T; raises for the lengths in ``fail_on``."""

    def __init__(self, calls: list, fail_on: set[int] = frozenset()) -> None:
        self.calls, self.fail_on = calls, fail_on

    def audio_tokens(self, frames: int) -> int:
        return frames // 4

    def encode_many(self, features):
        self.calls.append([f.shape[1] for f in features])
        if any(f.shape[1] in self.fail_on for f in features):
            raise RuntimeError("boom")
        return [torch.full((f.shape[1] // 4, 3), float(f.shape[1])) for f in features]


def test_blocks_are_filled_by_one_batched_call_at_flush():
    calls = []
    encodes = AudioEncodes(FakeEncoder(calls), width=3, dtype=torch.float32, device=torch.device("cpu"))
    a, b = encodes.block(torch.zeros(128, 200), floor=None), encodes.block(torch.zeros(128, 40), floor=-1.0)
    assert a.embeds.shape == (50, 3) and b.embeds.shape == (10, 3) and encodes.pending == 2
    assert encodes.flush() == 2 and calls == [[200, 40]] and encodes.pending == 0
    assert torch.all(a.embeds == 200) and torch.all(b.embeds == 40) and a.error is None
    assert encodes.flush() == 0 and calls == [[200, 40]], "nothing queued: no call"


def test_a_failing_block_keeps_its_error_and_the_others_are_encoded_alone():
    calls = []
    encodes = AudioEncodes(FakeEncoder(calls, fail_on={40}), width=3, dtype=torch.float32, device=torch.device("cpu"))
    good, bad = encodes.block(torch.zeros(128, 200), floor=None), encodes.block(torch.zeros(128, 40), floor=None)
    encodes.flush()
    assert calls == [[200, 40], [200], [40]]
    assert torch.all(good.embeds == 200) and good.error is None
    assert isinstance(bad.error, RuntimeError)


@pytest.mark.slow
@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))],
)
@torch.inference_mode()
def test_encoding_blocks_together_equals_encoding_each(tiny_model_dir, device):
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir, devices={"thinker": device}, dtypes={"thinker": torch.float32})
    runner = thinker_runner(ckpt, device=torch.device(device), dtype=torch.float32, kv_slots=2, max_len=64)
    gen = torch.Generator().manual_seed(0)
    features = [torch.randn(128, n, generator=gen) for n in (200, 37, 200, 3)]
    together = runner.encode_many(features)
    for f, got in zip(features, together):
        assert got.shape[0] == runner.audio_tokens(f.shape[1])
        torch.testing.assert_close(got, runner.encode_features(f), rtol=1e-5, atol=1e-5)


async def test_a_block_that_cannot_be_encoded_fails_the_reply_and_the_engine_serves_on(tiny_engine, caplog):
    core = tiny_engine.core
    encode_many = core.runner.thinker.encode_many

    def failing(features):
        if any(f.shape[1] == 57 for f in features):
            raise RuntimeError("encoder broke")
        return encode_many(features)

    core.runner.thinker.encode_many = failing
    try:
        conv = tiny_engine.conversation()
        await conv.add_audio("u1", np.zeros(16000 * 57 // 100, dtype=np.float32) + 0.01)  # a 57-frame tail
        done = await conv.respond(item_id="a1").wait()
        assert done.status.value == "failed" and done.error is not None
        assert "encoding an audio block failed" in caplog.text
        other = tiny_engine.conversation()
        await other.add_text("u1", "Hello")
        assert (await other.respond(item_id="a1", max_output_tokens=3).wait()).status.value in (
            "completed",
            "incomplete",
        )
        await conv.close()
        await other.close()
    finally:
        core.runner.thinker.encode_many = encode_many


class StubCore:
    """Just what the engine thread's loop calls, recording the order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.queued = 0
        self.step_wanted = False
        self.device = torch.device("cpu")
        self.decode_devices = (self.device,)
        self.backend = None

    def wake_on_results(self, callback) -> None:
        pass  # no token2wav worker, no picture work

    def has_work(self) -> bool:
        return self.queued > 0 or self.step_wanted

    def encode_audio(self) -> int:
        encoded, self.queued = self.queued, 0
        if encoded:
            self.events.append("encode")
            self.backend.submit(lambda core: core.events.append("response asked meanwhile"))
        return encoded

    def step(self) -> bool:
        self.events.append("step")
        self.step_wanted = False
        return False

    def close(self) -> None:
        self.events.append("closed")


def test_commands_that_arrive_during_the_encode_join_the_next_step():
    from pipeline.hosting.loop import EngineThread

    core = StubCore()
    engine = EngineThread(core)
    core.backend = engine
    try:

        def commit(c):
            c.events.append("commit")
            c.queued, c.step_wanted = 1, True

        engine.submit(commit).result(timeout=5)
        deadline = time.monotonic() + 5
        while "step" not in core.events and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.close()
    assert core.events[:4] == ["commit", "encode", "response asked meanwhile", "step"]
