"""``talker.overlap``: the talker decodes beside the thinker on vectors of earlier steps. Same text, same codes, same
audio as decoding after the thinker; only the timing moves (the talker starts one step later, never on a vector
made in the step it runs in); on a GPU the talker's batch runs on a stream of its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from conftest import greedy_stage_config, run_spoken_reply
from pipeline.config import DEFAULT_STAGE_CONFIG, ConfigError, parse_stage_config


def make_core(tiny_model_dir, overlap: str, device: str = "cpu"):
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config(
        device,
        thinker={"min_tokens": 6, "max_tokens": 6},
        talker={"min_tokens": 40, "max_tokens": 40, "overlap": overlap},
        token2wav={"worker_thread": "off", "compile": "off"},
    )
    devices = {"thinker": device, "talker": device, "token2wav": device}
    dtypes = {"thinker": torch.float32, "talker": torch.float32}  # as the config says
    return EngineCore(load_checkpoint(tiny_model_dir, devices=devices, dtypes=dtypes), cfg, seed=7)


def run_reply(core) -> tuple[list, np.ndarray, list[tuple[int, int]]]:
    """One spoken reply to the end; returns its codes, its audio and (text tokens, codes) after every step."""
    codes, audio, progress = run_spoken_reply(core)
    return codes, audio, [(text, codes) for text, codes, _ in progress]


@pytest.mark.slow
@torch.inference_mode()
def test_overlap_changes_when_the_talker_runs_not_what_it_makes(tiny_model_dir):
    off = make_core(tiny_model_dir, "off")
    on = make_core(tiny_model_dir, "on")
    assert not off.runner.overlap and on.runner.overlap
    codes_off, audio_off, progress_off = run_reply(off)
    codes_on, audio_on, progress_on = run_reply(on)
    assert len(codes_on) == 40 and codes_on == codes_off
    np.testing.assert_array_equal(audio_on, audio_off)
    # The first code comes from the talker's prefill, in the step of the first reply token's vector either way; the
    # talker's decodes then take, with overlap, only vectors made in earlier steps: one step later, and one token
    # further behind the text while the thinker writes.
    second_code = [next(i for i, (_, codes) in enumerate(p) if codes >= 2) for p in (progress_off, progress_on)]
    assert second_code[1] == second_code[0] + 1
    writing = range(3, 6)
    assert all(codes == text - 1 for text, codes in progress_off if text in writing)
    assert all(codes == text - 2 for text, codes in progress_on if text in writing)


def test_overlap_is_a_talker_setting_with_three_values():
    from pipeline.config import load_stage_config

    assert load_stage_config(overrides={"stages": {"talker": {"device": "cpu"}}}).talker.overlap is False  # auto
    assert load_stage_config(overrides={"stages": {"talker": {"device": "cuda"}}}).talker.overlap is True
    cfg = greedy_stage_config(talker={"overlap": "on"})
    assert cfg.talker.overlap is True
    cpu = greedy_stage_config(talker={"overlap": "auto"})  # on the CPU
    assert cpu.talker.overlap is False
    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    raw["stages"]["talker"]["overlap"] = "sideways"
    with pytest.raises(ConfigError, match="talker.overlap must be one of"):
        parse_stage_config(raw)
    raw["stages"]["talker"]["overlap"] = True  # YAML 1.1's bare `on`
    assert parse_stage_config(raw).talker.overlap is True
    raw["stages"]["talker"]["overlap"] = "on"
    raw["stages"]["thinker"]["overlap"] = "on"
    with pytest.raises(ConfigError, match="unknown field 'stages.thinker.overlap'"):
        parse_stage_config(raw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_on_the_gpu_the_talker_decodes_on_its_own_stream(tiny_model_dir):
    on = make_core(tiny_model_dir, "auto", device="cuda")
    assert on.overlap
    streams = []
    decode = on.talker.decode

    def noting(*args, **kwargs):
        streams.append(torch.cuda.current_stream())
        return decode(*args, **kwargs)

    on.talker.decode = noting
    codes_on, audio_on, _ = run_reply(on)
    assert streams and all(s == on._talker_cuda_stream for s in streams)
    assert on._talker_cuda_stream != torch.cuda.current_stream()
    off = make_core(tiny_model_dir, "off", device="cuda")
    codes_off, audio_off, _ = run_reply(off)
    assert codes_on == codes_off
    np.testing.assert_allclose(audio_on, audio_off, atol=1e-5)
