"""Tiny random Qwen3-Omni decoders (transformers' ``qwen3_omni_moe`` modules) and the check that
:class:`~pipeline.runners.decoder.PooledDecoder` runs them as their own ``forward`` does.

Shared by ``tests/unit/engine/test_qwen3_decoder.py`` and its Triton-interpreter check (a subprocess), so both build the
same models from the same seed. Sizes: hidden 64, heads 4 / kv heads 2, head_dim 32 (not hidden / heads: the configs'
own ``head_dim``), float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorConfig,
    Qwen3OmniMoeTalkerTextConfig,
    Qwen3OmniMoeTextConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorModel,
    Qwen3OmniMoeTalkerModel,
    Qwen3OmniMoeThinkerTextModel,
)

from pipeline.runners.decoder import PooledDecoder

MAX_LEN = 32
ROPE_LEN = 64
"""Rope positions run ahead of the cache indices on some axes (as a video's time axis does)."""
TOL = 1e-5
"""float32 throughout: ours and HF's differ only in the order of float32 sums (attention over the pool's slot rather
than the whole batch, GEMMs over other row counts, the experts' tokens grouped per step rather than per sequence), a
few ulps of activations of order 1 through 2-3 layers (seen: ~1e-6). A wrong rotation, axis or missing norm moves
them by 1e-2 or more (``test_the_positions_axes_matter_far_beyond_the_tolerance``)."""

_SECTION = [6, 5, 5]  # sums to head_dim / 2 = 16; Qwen3's thinker interleaves height and width every third frequency
_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _SECTION, "interleaved": True}
_COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)


def _randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Every weight drawn here rather than left to HF's init, which skips some (the talker's experts stay
    ``torch.empty``): matrices normal with std 0.1, RMSNorm weights (HF: ones) around 1, so that each norm, q/k norms
    included, is seen to be applied."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.3 * noise if name.endswith("norm.weight") else 0.1 * noise)


def thinker_body(seed: int = 0) -> Qwen3OmniMoeThinkerTextModel:
    """3 layers: MoE (8 experts, top 2, ``norm_topk_prob``), dense (``mlp_only_layers``), MoE; interleaved MRoPE."""
    config = Qwen3OmniMoeTextConfig(
        **_COMMON,
        num_hidden_layers=3,
        moe_intermediate_size=48,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        rope_parameters=dict(_ROPE),
    )
    return _ready(Qwen3OmniMoeThinkerTextModel(config), seed)


def talker_body(seed: int = 1) -> Qwen3OmniMoeTalkerModel:
    """2 layers of MoE with a shared expert and its sigmoid gate (8 experts, top 2, unnormalised top-k)."""
    config = Qwen3OmniMoeTalkerTextConfig(
        **_COMMON,
        num_hidden_layers=2,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=80,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        rope_parameters=dict(_ROPE),
    )
    return _ready(Qwen3OmniMoeTalkerModel(config), seed)


def code_predictor_body(seed: int = 2) -> Qwen3OmniMoeTalkerCodePredictorModel:
    """2 dense layers with q/k norms, 1-D rope."""
    config = Qwen3OmniMoeTalkerCodePredictorConfig(
        **_COMMON, num_hidden_layers=2, num_code_groups=4, rope_parameters={"rope_type": "default", "rope_theta": 1e4}
    )
    return _ready(Qwen3OmniMoeTalkerCodePredictorModel(config), seed)


def _ready(model, seed: int):
    _randomize(model, torch.Generator().manual_seed(seed))
    return model.eval()


BODIES = {"thinker": thinker_body, "talker": talker_body, "code_predictor": code_predictor_body}
THREE_D = {"thinker": True, "talker": True, "code_predictor": False}


@dataclass
class Conversation:
    """One batch row: ``x`` (n, H) input vectors of the prompt (its first ``prompt`` rows) and then one decode step per
    further row, at rope positions ``rope`` (3, n) (None: 1-D, the cache indices), in KV slot ``slot``."""

    slot: int
    prompt: int
    x: torch.Tensor
    rope: torch.Tensor | None


def conversations(hidden: int, three_d: bool, steps: int = 3, seed: int = 5) -> list[Conversation]:
    """Three rows in slots out of order, prompts of 9, 4 and 13 positions. 3-D rows get unequal axes: time runs ahead
    of the cache index, height and width wander (a picture's positions, then text)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for slot, prompt in ((3, 9), (0, 4), (1, 13)):
        n = prompt + steps
        rope = None
        if three_d:
            t = torch.arange(n) * 2 + 1
            h = torch.randint(0, ROPE_LEN, (n,), generator=gen)
            w = torch.randint(0, ROPE_LEN, (n,), generator=gen)
            rope = torch.stack([t, h, w])
        rows.append(Conversation(slot, prompt, torch.randn(n, hidden, generator=gen), rope))
    return rows


@torch.inference_mode()
def hf_forward(body, row: Conversation, **kwargs):
    """The HF module's forward over the row's whole sequence (prompt and steps) in one call."""
    position_ids = None if row.rope is None else row.rope[:, None, :]
    return body(inputs_embeds=row.x[None], position_ids=position_ids, use_cache=False, **kwargs)


def decoder_for(body) -> PooledDecoder:
    return PooledDecoder(
        body, slots=4, max_len=MAX_LEN, dtype=torch.float32, device=torch.device("cpu"), rope_len=ROPE_LEN
    )


@torch.inference_mode()
def check_prefill_then_decode(body, three_d: bool, *, graph_safe: bool) -> None:
    """Each row's prompt prefilled in two chunks (the second attends to the first's keys in the slot), then batched
    decode steps, every row at its own cache index and rope positions: equal to HF's forward over the whole sequence
    within :data:`TOL`. ``graph_safe``: the decode steps through the device-side attention (Triton)."""
    dec = decoder_for(body)
    rows = conversations(body.config.hidden_size, three_d)
    want = [hf_forward(body, row).last_hidden_state[0] for row in rows]
    for row, ref in zip(rows, want):
        half = row.prompt // 2
        for start, end in ((0, half), (half, row.prompt)):
            rope = None if row.rope is None else row.rope[:, start:end]
            got = dec.prefill(row.slot, row.x[start:end], start, rope)
            torch.testing.assert_close(got, ref[start:end], rtol=TOL, atol=TOL)
    slots = torch.tensor([row.slot for row in rows])
    for step in range(rows[0].x.shape[0] - rows[0].prompt):
        positions = torch.tensor([row.prompt + step for row in rows])
        x = torch.stack([row.x[p] for row, p in zip(rows, positions.tolist())])
        rope = None if not three_d else torch.stack([row.rope[:, p] for row, p in zip(rows, positions.tolist())], 1)
        got = dec.decode(x, slots, positions, rope, graph_safe=graph_safe)
        for b, (ref, p) in enumerate(zip(want, positions.tolist())):
            torch.testing.assert_close(got[b], ref[p], rtol=TOL, atol=TOL)
