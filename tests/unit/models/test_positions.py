"""TMRoPE positions (pipeline/models/common/tmrope.py) equal transformers' ``get_rope_index``, and the pooled
decoder rotates by them as HF's multimodal rotary embedding does (prefill in chunks and decode rows whose rope
position differs from their cache index)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2_5OmniThinkerForConditionalGeneration

from pipeline.models.common.hf_parts import thinker_text_model
from pipeline.models.common.tmrope import TMROPE, rope_positions, rope_shift, vision_offsets
from pipeline.models.positions import GridSpan
from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint
from pipeline.runners.decoder import PooledDecoder

MERGE = 2


@pytest.fixture(scope="module")
def thinker(tiny_model_dir):
    return Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def sharpened(thinker, factor: float = 8.0):
    """The thinker's text model with query/key projections scaled by ``factor``: attention sharp enough that a wrong
    rope position changes what a position attends to (a random tiny model is nearly blind to positions)."""
    body = thinker_text_model(thinker)
    with torch.no_grad():
        for layer in body.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                proj.weight.mul_(factor)
                if proj.bias is not None:
                    proj.bias.mul_(factor)
    return body


def layout(cfg, parts):
    """Token ids of ``parts`` (("text", n) | ("image", (t, h, w)) | ("audio", n)) with the markers HF expects, the
    explicit spans our positions take, the image grids and the audio feature lengths for ``get_rope_index``."""
    ids, spans, grids, audio = [], [], [], []
    for kind, arg in parts:
        if kind == "text":
            ids += [7 + (i % 50) for i in range(arg)]
        elif kind == "image":
            t, h, w = arg
            offsets = vision_offsets(t, h, w, merge=MERGE, t_step=cfg.position_id_per_seconds)
            ids.append(cfg.vision_start_token_id)
            spans.append(GridSpan(at=len(ids), offsets=offsets))
            ids += [cfg.image_token_id] * offsets.shape[1]
            ids.append(cfg.vision_end_token_id)
            grids.append(arg)
        else:
            ids += [cfg.audio_start_token_id, *[cfg.audio_token_id] * arg, cfg.audio_end_token_id]
            audio.append(4 * arg)  # feature frames the audio tower turns into `arg` tokens
    return ids, spans, grids, audio


def hf_positions(thinker, ids, grids, audio) -> np.ndarray:
    pos, delta = thinker.get_rope_index(
        torch.tensor([ids]),
        image_grid_thw=torch.tensor(grids) if grids else None,
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        audio_seqlens=torch.tensor(audio) if audio else None,
    )
    assert int(delta) == int(pos.max()) + 1 - len(ids)
    return pos[:, 0].numpy()


PROMPTS = {
    "one image": [("text", 5), ("image", (1, 4, 6)), ("text", 3)],
    "several images, text between, several turns": [
        ("text", 9),
        ("image", (1, 4, 6)),
        ("text", 2),
        ("image", (1, 8, 2)),
        ("text", 11),
        ("audio", 7),
        ("text", 6),
        ("image", (1, 2, 2)),
        ("image", (1, 6, 6)),
        ("text", 4),
    ],
    "an image first": [("image", (1, 6, 4)), ("text", 2)],
    "two temporal patches": [("text", 2), ("image", (2, 4, 4)), ("text", 2)],
}


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_positions_equal_get_rope_index(thinker, name):
    cfg = thinker.config
    ids, spans, grids, audio = layout(cfg, PROMPTS[name])
    want = hf_positions(thinker, ids, grids, audio)
    got = rope_positions(len(ids), spans)
    np.testing.assert_array_equal(got, want)
    # every prefix (an incremental prefill's chunks) and every suffix start agree with the whole
    for cut in range(0, len(ids), 3):
        head = rope_positions(cut, spans)
        np.testing.assert_array_equal(head if head is not None else np.arange(cut)[None].repeat(3, 0), want[:, :cut])
        np.testing.assert_array_equal(rope_positions(len(ids), spans, start=cut), want[:, cut:])
    # text after the last span continues at HF's rope delta
    assert rope_shift(spans, len(ids)) == int(want.max()) + 1 - len(ids)


def test_without_spans_positions_are_the_cache_indices():
    assert rope_positions(10, []) is None
    assert rope_shift([], 10) == 0
    span = GridSpan(at=20, offsets=vision_offsets(1, 4, 4, merge=2, t_step=25))
    assert rope_positions(20, [span]) is None  # the span lies past the prefix
    with pytest.raises(ValueError, match="inside"):
        rope_shift([span], 21)
    with pytest.raises(ValueError, match="overlap"):
        rope_positions(40, [span, GridSpan(at=22, offsets=span.offsets)])


@torch.inference_mode()
def test_decoder_rotates_by_3d_positions_as_hf_does(tiny_model_dir):
    """Prefill in chunks (one cut inside a picture) and decode rows after pictures (rope position = cache index +
    shift) give HF's hidden states for the same positions, on a sharpened model where 1-D positions do not."""
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    body = sharpened(thinker)
    cfg = thinker.config
    ids, spans, grids, audio = layout(cfg, PROMPTS["several images, text between, several turns"])
    n = len(ids)
    extra = [11, 12, 13]  # decoded tokens after the prompt
    full = torch.tensor([ids + extra])
    pos = torch.from_numpy(hf_positions(thinker, ids, grids, audio))
    shift = rope_shift(spans, n)
    tail = torch.arange(n, n + len(extra))[None].repeat(3, 1) + shift
    all_pos = torch.cat([pos, tail], dim=1)
    embeds = body.embed_tokens(full)
    want = body(inputs_embeds=embeds, position_ids=all_pos[:, None]).last_hidden_state[0]
    plain = body(inputs_embeds=embeds, position_ids=torch.arange(full.shape[1])[None]).last_hidden_state[0]
    assert (plain - want).abs().max() > 1e-2  # the sharpened model sees positions

    dec = PooledDecoder(body, slots=2, max_len=128, dtype=torch.float32, device=torch.device("cpu"))
    x = embeds[0]
    cut = spans[0].at + 3  # inside the first picture
    got = [
        dec.prefill(1, x[:cut], 0, torch.from_numpy(rope_positions(cut, spans))),
        dec.prefill(1, x[cut:n], cut, torch.from_numpy(rope_positions(n, spans, start=cut))),
    ]
    for k in range(len(extra)):
        at = n + k
        rope = torch.full((3, 1), at + shift)
        got.append(dec.decode(x[at : at + 1], torch.tensor([1]), torch.tensor([at]), rope))
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_decoder_without_rope_is_unchanged(tiny_model_dir):
    """``rope`` None and ``rope`` equal to the cache indices on every axis rotate alike (text-only conversations)."""
    ckpt = load_checkpoint(tiny_model_dir)
    body = thinker_text_model(ckpt.thinker)
    dec = PooledDecoder(body, slots=2, max_len=32, dtype=torch.float32, device=torch.device("cpu"))
    x = torch.randn(9, body.config.hidden_size)
    a = dec.prefill(0, x, 0)
    b = dec.prefill(1, x, 0, torch.arange(9)[None].repeat(3, 1))
    assert torch.equal(a, b)
    step = torch.randn(2, body.config.hidden_size)
    slots, positions = torch.tensor([0, 1]), torch.tensor([9, 9])
    c = dec.decode(step, slots, positions)
    d = dec.decode(step, slots, positions, positions[None].repeat(3, 1))
    assert torch.equal(c, d)


def test_a_span_advance_overrides_the_largest_offset():
    """A spoken message with video ends at its last block, not its largest offset: the text after the span continues
    at ``at + advance`` (a tall picture grid in the first chunk must not push it further)."""
    offsets = np.array([[0, 1, 1, 3], [0, 9, 1, 3], [0, 1, 9, 3]], dtype=np.int64)
    plain, advanced = GridSpan(at=2, offsets=offsets), GridSpan(at=2, offsets=offsets, advance=5)
    assert plain.extent == 10 and advanced.extent == 5
    positions = rope_positions(8, [advanced])
    np.testing.assert_array_equal(positions[:, 6:], np.broadcast_to([7, 8], (3, 2)))
    assert rope_shift([advanced], 6) == 1


@torch.inference_mode()
def test_graphed_prefill_rows_equal_the_prefill_with_pictures(tiny_model_dir):
    """The prefill-as-rows step (captured as a CUDA graph on the GPU; here its eager row step, the same function) over
    two spans in two slots, one with 3-D rope positions, gives the hidden states of plain prefills of those spans."""
    from pipeline.runners.decode_graphs import graphed_prefill, prefill_graphs

    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    body = sharpened(thinker)
    ids, spans, _, _ = layout(thinker.config, PROMPTS["several images, text between, several turns"])
    x = body.embed_tokens(torch.tensor(ids))
    n = len(ids)
    rope = torch.from_numpy(rope_positions(n, spans))
    dec = PooledDecoder(body, slots=4, max_len=128, dtype=torch.float32, device=torch.device("cpu"))
    want = [dec.prefill(0, x, 0, rope), dec.prefill(1, x[:7], 0)]
    rows = prefill_graphs(dec, width=x.shape[1], dtype=torch.float32, cuda_graphs=False)
    got = graphed_prefill(rows, [(2, x, 0, rope), (3, x[:7], 0, None)])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)  # rows attend one query at a time: summation order


def test_the_tmrope_scheme_is_these_functions():
    """The family's :class:`~pipeline.models.positions.PositionScheme`: a picture is one temporal patch at time 0."""
    span = GridSpan(at=3, offsets=TMROPE.image_offsets((1, 4, 6), merge=2))
    np.testing.assert_array_equal(span.offsets, vision_offsets(1, 4, 6, merge=2, t_step=0))
    assert span.offsets.shape == (3, 6) and span.extent == 3
    np.testing.assert_array_equal(TMROPE.rope_positions(12, [span], start=2), rope_positions(12, [span], start=2))
    assert TMROPE.rope_shift([span], 12) == rope_shift([span], 12) == -3
