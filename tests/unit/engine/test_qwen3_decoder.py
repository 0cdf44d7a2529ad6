"""PooledDecoder runs Qwen3-Omni's decoders (transformers' ``qwen3_omni_moe``) as their own ``forward`` does: the
thinker's text model (q/k norms, MoE and dense layers, interleaved MRoPE, deepstack), the talker's body (MoE with a
shared expert) and the code predictor (dense, 1-D rope). Tiny random models from tests/helpers/qwen3_decoders.py;
tolerances are explained there (``TOL``)."""

from __future__ import annotations

import pytest
import torch

from pipeline.errors import CheckpointError
from pipeline.kernels.fused_decode import fusable
from pipeline.runners.decoder import PooledDecoder, rope_axes
from tests.helpers.qwen3_decoders import (
    BODIES,
    MAX_LEN,
    ROPE_LEN,
    THREE_D,
    TOL,
    Conversation,
    check_prefill_then_decode,
    code_predictor_body,
    conversations,
    decoder_for,
    hf_forward,
)
from tests.helpers.triton_check import TritonCheck


@pytest.fixture(scope="module")
def bodies():
    return {name: build() for name, build in BODIES.items()}


def test_rope_axes_are_read_from_the_hf_rotary_embeddings(bodies):
    """Qwen3 (thinker and talker): frequency j takes height when j % 3 == 1 and j < 3 * sections[1], width when
    j % 3 == 2 and j < 3 * sections[2], else time, both halves alike; the code predictor is 1-D; Qwen2.5's sections
    stay contiguous blocks, the layout the fused kernel takes."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniTextConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniRotaryEmbedding

    sections = bodies["thinker"].rotary_emb.mrope_section
    half = [
        1 if j % 3 == 1 and j < 3 * sections[1] else 2 if j % 3 == 2 and j < 3 * sections[2] else 0 for j in range(16)
    ]
    for name in ("thinker", "talker"):
        dec = decoder_for(bodies[name])
        assert dec.rope_axes.tolist() == half * 2 and dec.mrope_section is None, name
    assert decoder_for(bodies["code_predictor"]).rope_axes.tolist() == [0] * 32
    config = Qwen2_5OmniTextConfig(
        hidden_size=64, num_attention_heads=2, rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6]}
    )
    assert rope_axes(Qwen2_5OmniRotaryEmbedding(config), 32).tolist() == ([0] * 4 + [1] * 6 + [2] * 6) * 2


@pytest.mark.parametrize("name", list(BODIES))
def test_prefill_then_batched_decode_equals_the_hf_forward(bodies, name):
    check_prefill_then_decode(bodies[name], THREE_D[name], graph_safe=False)


@torch.inference_mode()
def test_the_positions_axes_matter_far_beyond_the_tolerance(bodies):
    """The check above could not miss an axis mix-up: swapping the height and width positions, or dropping the q/k
    norms, moves HF's own outputs by far more than ``TOL``."""
    body = bodies["thinker"]
    row = conversations(body.config.hidden_size, three_d=True)[2]
    want = hf_forward(body, row).last_hidden_state[0]
    swapped = Conversation(row.slot, row.prompt, row.x, row.rope[[0, 2, 1]])
    assert (hf_forward(body, swapped).last_hidden_state[0] - want).abs().max() > 1000 * TOL
    saved = [(layer.self_attn.q_norm, layer.self_attn.k_norm) for layer in body.layers]
    try:
        for layer in body.layers:
            layer.self_attn.q_norm = layer.self_attn.k_norm = torch.nn.Identity()
        assert (hf_forward(body, row).last_hidden_state[0] - want).abs().max() > 1000 * TOL
    finally:
        for layer, (q_norm, k_norm) in zip(body.layers, saved):
            layer.self_attn.q_norm, layer.self_attn.k_norm = q_norm, k_norm


def _visual_prompt(body, seed: int = 7):
    """A 13-position prompt whose rows 3..8 are a picture's (3-D positions), deepstack features for them in the first
    two of the three layers (HF adds ``deepstack_visual_embeds[i]`` to layer i's output), then 2 text steps."""
    gen = torch.Generator().manual_seed(seed)
    row = conversations(body.config.hidden_size, three_d=True, steps=2, seed=seed)[2]
    visual = torch.arange(3, 9)
    features = [torch.randn(len(visual), body.config.hidden_size, generator=gen) for _ in range(2)]
    mask = torch.zeros(1, row.x.shape[0], dtype=torch.bool)
    mask[0, visual] = True
    return row, visual, features, mask


@torch.inference_mode()
def test_deepstack_features_and_captured_layers_equal_hf(bodies):
    """Prefill in two chunks that split the picture, each chunk given its own rows' features: the outputs, the text
    steps decoded after (their keys were made from the deepstacked states) and every ``output_hidden_states`` entry
    (layer outputs before their deepstack addition) equal HF's."""
    body = bodies["thinker"]
    row, visual, features, mask = _visual_prompt(body)
    hf = hf_forward(body, row, visual_pos_masks=mask, deepstack_visual_embeds=features, output_hidden_states=True)
    want, states = hf.last_hidden_state[0], [s[0] for s in hf.hidden_states]
    assert len(states) == len(body.layers) + 1
    plain = hf_forward(body, row).last_hidden_state[0]
    assert (plain[: row.prompt] - want[: row.prompt]).abs().max() > 1000 * TOL  # the features matter
    for k in range(len(states)):
        dec = decoder_for(body)
        for start, end in ((0, 6), (6, row.prompt)):
            inside = visual[(visual >= start) & (visual < end)]
            chunk = [(inside - start, f[(visual >= start) & (visual < end)]) for f in features]
            hidden, captured = dec.prefill(
                row.slot, row.x[start:end], start, row.rope[:, start:end], deepstack=chunk, capture_layer=k
            )
            torch.testing.assert_close(hidden, want[start:end], rtol=TOL, atol=TOL)
            torch.testing.assert_close(captured, states[k][start:end], rtol=TOL, atol=TOL, msg=f"hidden_states[{k}]")
        for p in range(row.prompt, row.x.shape[0]):
            hidden, captured = dec.decode(
                row.x[p : p + 1], torch.tensor([row.slot]), torch.tensor([p]), row.rope[:, p : p + 1], capture_layer=k
            )
            torch.testing.assert_close(hidden[0], want[p], rtol=TOL, atol=TOL)
            torch.testing.assert_close(captured[0], states[k][p], rtol=TOL, atol=TOL)


@torch.inference_mode()
def test_decode_rows_take_dense_deepstack_features_as_a_graphed_prefill_does(bodies):
    """A prompt run as decode rows (one per position, all in one slot: the graphed prefill's step) with the features
    as dense (rows, H) tensors, zero off the picture: the same outputs and captured layer as HF's."""
    body = bodies["thinker"]
    row, visual, features, mask = _visual_prompt(body)
    hf = hf_forward(body, row, visual_pos_masks=mask, deepstack_visual_embeds=features, output_hidden_states=True)
    n = row.x.shape[0]
    dense = []
    for f in features:
        d = torch.zeros(n, body.config.hidden_size)
        d[visual] = f
        dense.append(d)
    dec = decoder_for(body)
    slots, positions = torch.full((n,), 2), torch.arange(n)
    hidden, captured = dec.decode(row.x, slots, positions, row.rope, deepstack=dense, capture_layer=2)
    torch.testing.assert_close(hidden, hf.last_hidden_state[0], rtol=TOL, atol=TOL)
    torch.testing.assert_close(captured, hf.hidden_states[2][0], rtol=TOL, atol=TOL)


def test_qwen3_layers_are_left_unfused(bodies):
    """The fused step knows neither q/k norms, MoE blocks nor interleaved rope: ``fuse`` leaves these decoders on
    the HF layers (the code predictor's dense layers too, for their q/k norms)."""
    for name, body in bodies.items():
        assert not any(fusable(layer) for layer in body.layers), name
        dec = PooledDecoder(body, slots=1, max_len=8, dtype=torch.float32, device=torch.device("cpu"), fuse=True)
        assert dec.fused is None, name


def test_bad_extras_and_sliding_windows_are_refused(bodies):
    dec = decoder_for(bodies["thinker"])
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="capture_layer"):
        dec.prefill(0, x, 0, capture_layer=4)
    with pytest.raises(ValueError, match="deepstack"):
        dec.prefill(0, x, 0, deepstack=[(torch.tensor([0]), torch.randn(1, 64))] * 4)
    with pytest.raises(ValueError, match="capture_layer"):
        dec.decode(x, torch.tensor([0, 1]), torch.tensor([0, 0]), capture_layer=-1)
    windowed = code_predictor_body()
    windowed.layers[1].self_attn.sliding_window = 4
    with pytest.raises(CheckpointError, match="sliding window"):
        PooledDecoder(windowed, slots=1, max_len=8, dtype=torch.float32, device=torch.device("cpu"))


# The graph-safe decode step (the Triton attention that reads lengths on the device) in Triton's interpreter: the same
# prefill-then-decode check for the three bodies. Each row's positions split 2 ways rather than the 16 the CPU default
# picks for so few rows: the interpreter runs programs one by one (~2 s a call instead of ~0.5 s), and every split
# count is checked against the reference in test_kv_pool.py.
GRAPH_SAFE_CHECK = """
import functools
import torch
torch.set_num_threads(1)
import pipeline.runners.decoder as decoder
from tests.helpers.qwen3_decoders import BODIES, THREE_D, check_prefill_then_decode
decoder.attend_triton = functools.partial(decoder.attend_triton, splits=2)
for name, build in BODIES.items():
    check_prefill_then_decode(build(), THREE_D[name], graph_safe=True)
print("ok")
"""

GRAPH_SAFE = TritonCheck(GRAPH_SAFE_CHECK, timeout_s=300, interpreter_only=True)  # with CUDA: the GPU test below


@pytest.mark.slow
@pytest.mark.background(GRAPH_SAFE)
def test_graph_safe_decode_equals_the_hf_forward_in_the_triton_interpreter():
    GRAPH_SAFE.assert_ok()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_captured_steps_of_qwen3_bodies_replay_the_eager_step_on_the_gpu():
    """q/k norms, interleaved rope, HF's MoE blocks (grouped-mm experts) and the compiled Triton attention captured in
    CUDA graphs, bfloat16: the graphed prefill (each position a row of one captured step) equals the same step run
    eagerly. In float32 transformers' grouped-mm experts fall back to a loop over host-side offsets, which a graph
    cannot capture: Qwen3's MoE decoders are graphed in bfloat16 (the arithmetic against HF is the CPU tests')."""
    from pipeline.runners.decode_graphs import graphed_prefill, prefill_graphs

    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    for name, build in BODIES.items():
        body = build().to(cuda, bf16)
        dec = PooledDecoder(body, slots=4, max_len=MAX_LEN, dtype=bf16, device=cuda, rope_len=ROPE_LEN)
        graphs = prefill_graphs(dec, width=body.config.hidden_size, dtype=bf16, cuda_graphs=True)
        graphs.capture()
        rows = conversations(body.config.hidden_size, THREE_D[name])
        spans = [
            (r.slot, r.x[: r.prompt].to(cuda, bf16), 0, None if r.rope is None else r.rope[:, : r.prompt]) for r in rows
        ]
        graphed = graphed_prefill(graphs, spans)
        assert graphs.replays == 1 and graphs.eager_steps == 0, name
        # the same step eagerly, padded as the replay was (scratch slot, position 0, zeros) so that every GEMM has the
        # same shape: a bf16 rounding elsewhere could flip an expert choice
        n = sum(r.prompt for r in rows)
        pad = min(size for size in graphs.captured if size >= n) - n
        slots = torch.cat([torch.full((r.prompt,), r.slot) for r in rows] + [torch.full((pad,), dec.pool.scratch_slot)])
        positions = torch.cat([torch.arange(r.prompt) for r in rows] + [torch.zeros(pad, dtype=torch.long)])
        rope = positions.expand(3, -1)
        if THREE_D[name]:
            rope = torch.cat([r.rope[:, : r.prompt] for r in rows] + [torch.zeros(3, pad, dtype=torch.long)], 1)
        x = torch.cat(
            [x for _, x, _, _ in spans] + [torch.zeros(pad, body.config.hidden_size, device=cuda, dtype=bf16)]
        )
        eager = dec.decode(x, slots.to(cuda), positions.to(cuda), rope.to(cuda), graph_safe=True)
        torch.testing.assert_close(torch.cat(graphed), eager[:n], rtol=1e-2, atol=1e-2, msg=name)
