"""A tiny random Qwen2.5-Omni token2wav and the ways the token2wav tests drive it: utterances, streams
stepped alone or together, stage configs of its options, and the tolerances they compare audio with."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniToken2WavConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

from pipeline.config import parse_stage_config
from pipeline.errors import ConfigError
from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav, StreamStatus

MEL_DIM = 20
ENC_EMB_DIM = 8
NUM_CODES = 128
HOP = 240
SAMPLES_PER_CODE = 2 * HOP  # 480 samples = 20 ms at 24 kHz


def build_token2wav(
    *, look_ahead=(1,), look_back=(0, 2), block_size=24, dit_gain=2.0, smooth_vocoder=False
) -> Qwen2_5OmniToken2WavModel:
    """Tiny token2wav. Defaults mirror the 7B layout scaled to 4 layers (look-ahead in a middle layer,
    look-back in the first and a late one). ``dit_gain`` scales the re-drawn DiT weights (larger: blocks
    influence each other more). ``smooth_vocoder`` makes BigVGAN a linear interpolator of the mel frames
    (zeroed residual blocks, triangular transposed convolutions) so clicks stand out."""
    dit = dict(
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        head_dim=16,
        ff_mult=2,
        emb_dim=16,
        block_size=block_size,
        look_ahead_layers=list(look_ahead),
        look_backward_layers=list(look_back),
        repeats=2,
        num_embeds=NUM_CODES,
        mel_dim=MEL_DIM,
        enc_emb_dim=ENC_EMB_DIM,
        enc_dim=16,
        enc_channels=[16, 16, 16, 16, 48],
        enc_kernel_sizes=[5, 3, 3, 3, 1],
        enc_dilations=[1, 2, 3, 4, 1],
        enc_attention_channels=8,
        enc_res2net_scale=2,
        enc_se_channels=8,
        dropout=0.0,
    )
    # Rates multiply to the 240-sample hop; kernel - rate is even so each layer upsamples exactly.
    vocoder = dict(
        mel_dim=MEL_DIM,
        upsample_initial_channel=128,
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1, 3, 5]],
        upsample_rates=[8, 6, 5],
        upsample_kernel_sizes=[16, 12, 11],
    )
    torch.manual_seed(0)
    model = Qwen2_5OmniToken2WavModel(Qwen2_5OmniToken2WavConfig(dit_config=dit, bigvgan_config=vocoder)).float().eval()
    with torch.no_grad():
        for module in model.code2wav_dit_model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                module.reset_parameters()
                module.weight.mul_(dit_gain)
        if smooth_vocoder:
            _make_interpolating(model.code2wav_bigvgan_model)
            model.code2wav_bigvgan_model.conv_post.weight.mul_(10.0)  # peak ~0.4
        else:
            model.code2wav_bigvgan_model.conv_post.weight.mul_(300.0)  # random init gives ~1e-3 peaks
    return model


def _make_interpolating(vocoder) -> None:
    for (upsample,) in vocoder.ups:
        kernel, stride = upsample.kernel_size[0], upsample.stride[0]
        taps = torch.arange(kernel, dtype=torch.float32)
        triangle = (1 - (taps - (kernel - 1) / 2).abs() / stride).clamp(min=0)
        upsample.weight.zero_()
        upsample.bias.zero_()
        for channel in range(upsample.weight.shape[1]):
            upsample.weight[channel, channel] = triangle
    for block in vocoder.resblocks:
        for conv in [*block.convs1, *block.convs2]:
            conv.weight.zero_()
            conv.bias.zero_()


def utterance(n_codes: int, seed: int = 1, noise_frames: int | None = None):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, NUM_CODES, (n_codes,), generator=g).tolist()
    cond = torch.randn(1, ENC_EMB_DIM, generator=g)
    ref_mel = torch.randn(1, 50, MEL_DIM, generator=g)
    noise = torch.randn(1, noise_frames or 2 * n_codes, MEL_DIM, generator=g)
    return codes, cond, ref_mel, noise


FLOAT_NOISE = 1e-5
"""Streamed vs one-shot when chunking is exact: float32 rounding only (RoPE at the same absolute
positions, masked attention over fewer keys): observed ~2e-7 against a 0.4 peak."""


BATCH_LENGTHS = (70, 23, 100)
BATCH_ROUNDS = (  # per stream: codes pushed so far, finished?
    ((70, False), (23, True), (60, False)),  # 3 first chunks (windows of 72, 46 and 72 frames)
    ((70, True), (23, True), (100, False)),  # 2 second chunks (windows of 140 and 144)
    ((70, True), (23, True), (100, True)),  # a last chunk (68) beside a middle one (128), then C's last alone
)


def drive_together(t2w: StreamingToken2Wav, cases) -> tuple[list[list[np.ndarray]], list[int]]:
    """Play :data:`BATCH_ROUNDS`: push and finish as scripted, then one ``step_many`` over every ready stream;
    drain at the end. Returns each stream's chunks and the size of every ``step_many`` batch."""
    streams = [t2w.start(cond, ref_mel, noise=noise, max_codes=len(codes)) for codes, cond, ref_mel, noise in cases]
    chunks, batches = [[] for _ in streams], []

    def step_ready() -> None:
        ready = [i for i, s in enumerate(streams) if s.ready()]
        batches.append(len(ready))
        for i, samples in zip(ready, t2w.step_many([streams[i] for i in ready])):
            chunks[i].append(samples)

    for scripted in BATCH_ROUNDS:
        for stream, (codes, _, _, _), (pushed, finished) in zip(streams, cases, scripted):
            if stream.status is StreamStatus.OPEN:
                stream.push(codes[stream.codes_received : pushed])
                if finished:
                    stream.finish()
        step_ready()
    while not all(s.done for s in streams):
        step_ready()
    return chunks, batches


GPU_TOLERANCE = 3e-4
"""Graph replay vs eager on the same GPU, against a ~0.4 peak. On an H200 the replayed DiT solve (padded or not)
equalled the eager one bit for bit; what differs is the vocoder, whose cuDNN convolutions (TF32 by default in
PyTorch) round differently from call to call and from one batch size to another: vocoding a batch of streams
against each stream alone differed by up to 1.5e-4 on the H100 (0.04 % of the peak)."""


def run_stream(t2w: StreamingToken2Wav, codes, cond, ref_mel, noise) -> list[np.ndarray]:
    """Push codes 7 at a time, stepping whenever ready, then finish and drain."""
    stream = t2w.start(cond, ref_mel, noise=noise, max_codes=len(codes))
    chunks = []
    for i in range(0, len(codes), 7):
        stream.push(codes[i : i + 7])
        while stream.ready():
            chunks.append(stream.step())
    stream.finish()
    while not stream.done:
        chunks.append(stream.step())
    return chunks


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (all functions)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def stages(**token2wav) -> dict:
    return {
        "model_family": "qwen2_5_omni",
        "stages": {
            "thinker": {"input": "request"},
            "talker": {"input": "thinker", "connector": "thinker_to_talker"},
            "token2wav": {"input": "talker", "connector": "talker_to_token2wav", **token2wav},
        },
    }


def assert_refused(doc: dict, param: str) -> None:
    """The stage config ``doc`` is refused with a ConfigError naming ``param``."""
    with pytest.raises(ConfigError) as info:
        parse_stage_config(doc)
    assert info.value.param == param


def on_the_talker(field: str, value) -> dict:
    """A stage config that gives the talker a token2wav-only ``field``."""
    doc = stages()
    doc["stages"]["talker"][field] = value
    return doc


FUSED_TOLERANCE = 1e-5
"""Fused kernel vs module, relative to the signal's peak (~1-10): the same float32 arithmetic with the filter sums in
another order (measured 5e-7 of the peak at most, interpreter); a wrong tap, phase or edge moves samples by orders of
magnitude more."""


def trained_like(model):
    """``model`` with every SnakeBeta's log-scale alpha and beta drawn around 0 (each channel its own frequency and
    magnitude, as after training; the checkpoint initializes them all to 0)."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "alpha") and hasattr(module, "beta"):
                module.alpha.copy_(torch.randn(module.alpha.shape, generator=generator) * 0.5)
                module.beta.copy_(torch.randn(module.beta.shape, generator=generator) * 0.5)
    return model
