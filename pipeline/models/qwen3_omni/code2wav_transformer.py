"""Qwen3-Omni code2wav's transformer run incrementally: new frames of several streams at once, each stream's past
carried by a sliding-window key/value cache.

The transformer (``Qwen3OmniMoeCode2Wav.pre_transformer``) is causal and every layer attends over a sliding window of
``sliding_window`` (W) positions, itself included: frame ``t`` sees the layer's keys of frames ``(t - W, t]``. Its
positions are absolute (``arange`` from the utterance's first frame, rotated into queries and keys by RoPE). Stacked,
the layers reach ``num_hidden_layers * (W - 1)`` frames back (568, 45 s, in the released checkpoint), so re-running a
window of past frames would need that much context to be exact. Instead each stream keeps, per layer, the rotated keys
and the values of its last ``W - 1`` frames: a new frame's query, at its absolute position, then attends over exactly
the keys the whole utterance's pass gives it, and every per-frame step (norms, projections, MLP, layer scales) is the
module's own. So a frame's hidden state equals the one-shot pass's up to float rounding (the order of sums in
differently shaped matrix products), whatever the split of the utterance into steps.

Batching: streams with different numbers of new frames and of cached frames share one pass, padded. A padded query row
attends to itself only (its key position lies after every real one, so causality hides it from real rows); a cache slot
of a stream with fewer cached frames carries a position no window reaches. Rows never mix, so padding changes no real
row's result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCode2Wav,
    apply_rotary_pos_emb,
)

__all__ = ["KVWindow", "transformer_step"]

_FAR = -(1 << 40)
"""Key position of an empty cache slot: no query's window reaches back this far."""


@dataclass(frozen=True)
class KVWindow:
    """One stream's transformer state: the rotated keys and the values of its last ``min(frames, W - 1)`` frames,
    ``(layers, kv_heads, cached, head_dim)`` each (the module's device and dtype), and ``frames``, how many frames the
    stream has run (the next frame's absolute position)."""

    keys: Tensor
    values: Tensor
    frames: int

    @property
    def cached(self) -> int:
        return self.keys.shape[2]

    @classmethod
    def empty(cls, model: Qwen3OmniMoeCode2Wav) -> KVWindow:
        cfg = model.config
        attention = model.pre_transformer.layers[0].self_attn
        param = next(model.parameters())
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, 0, attention.head_dim)
        blank = torch.zeros(shape, device=param.device, dtype=param.dtype)
        return cls(blank, blank, 0)


def _positions(windows: list[KVWindow], frames: list[int], device: torch.device) -> tuple[Tensor, Tensor, int]:
    """Absolute query positions (B, n) of the new frames (padding rows continue counting), and key positions
    (B, cached + n) of the left-padded cache slots then the new frames; ``cached``, the cache slots per row."""
    new = max(frames)
    cached = max(w.cached for w in windows)
    steps = torch.arange(new, device=device)
    starts = torch.tensor([w.frames for w in windows], device=device)
    query = starts[:, None] + steps
    slot = torch.arange(cached, device=device) - cached  # -cached .. -1, relative to each row's first new frame
    lengths = torch.tensor([w.cached for w in windows], device=device)
    past = torch.where(slot >= -lengths[:, None], starts[:, None] + slot, torch.full_like(slot, _FAR))
    return query, torch.cat([past, query], dim=1), cached


def _cache(windows: list[KVWindow], cached: int, layer: int, values: bool) -> Tensor:
    """Layer ``layer``'s cached keys (or values) of every row, left-padded with zeros to ``cached`` slots."""
    rows = []
    for w in windows:
        t = (w.values if values else w.keys)[layer]
        rows.append(F.pad(t, (0, 0, cached - t.shape[1], 0)))
    return torch.stack(rows)


def transformer_step(
    model: Qwen3OmniMoeCode2Wav, embeds: Tensor, frames: list[int], windows: list[KVWindow]
) -> tuple[Tensor, list[KVWindow]]:
    """Run the transformer on new frames of several streams.

    ``embeds`` (B, n, hidden): row ``i`` holds stream ``i``'s next ``frames[i]`` frames' code embeddings (the rest of
    the row is padding, any value); ``windows[i]`` its state. Returns the final-norm hidden states (B, n, hidden),
    valid in each row's first ``frames[i]`` positions, and each stream's state after those frames. The caller holds
    inference mode."""
    tr = model.pre_transformer
    width = model.config.sliding_window
    query_pos, key_pos, cached = _positions(windows, frames, embeds.device)
    mask = (key_pos[:, None, :] <= query_pos[:, :, None]) & (key_pos[:, None, :] > query_pos[:, :, None] - width)
    mask = mask[:, None]  # (B, 1, n, cached + n), broadcast over heads
    cos, sin = tr.rotary_emb(embeds, query_pos)
    hidden = embeds
    batch, new = embeds.shape[:2]
    kept_keys, kept_values = [], []
    for index, layer in enumerate(tr.layers[: model.config.num_hidden_layers]):
        attention = layer.self_attn
        heads = (batch, new, -1, attention.head_dim)
        normed = layer.input_layernorm(hidden)
        query = attention.q_norm(attention.q_proj(normed).view(heads)).transpose(1, 2)
        key = attention.k_norm(attention.k_proj(normed).view(heads)).transpose(1, 2)
        value = attention.v_proj(normed).view(heads).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        keys = torch.cat([_cache(windows, cached, index, values=False), key], dim=2)
        values = torch.cat([_cache(windows, cached, index, values=True), value], dim=2)
        kept_keys.append(keys)
        kept_values.append(values)
        groups = attention.num_key_value_groups
        out = F.scaled_dot_product_attention(
            query,
            keys.repeat_interleave(groups, dim=1),
            values.repeat_interleave(groups, dim=1),
            attn_mask=mask,
            scale=attention.scaling,
        )
        out = attention.o_proj(out.transpose(1, 2).reshape(batch, new, -1))
        hidden = hidden + layer.self_attn_layer_scale(out)
        hidden = hidden + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
    hidden = tr.norm(hidden)
    return hidden, _advance(windows, frames, cached, kept_keys, kept_values, width - 1)


def _advance(
    windows: list[KVWindow], frames: list[int], cached: int, keys: list[Tensor], values: list[Tensor], keep: int
) -> list[KVWindow]:
    """Each row's state after its new frames: the last ``keep`` real key/value slots of every layer."""
    out = []
    stacked_keys, stacked_values = torch.stack(keys, dim=1), torch.stack(values, dim=1)  # (B, layers, kv, slots, d)
    for row, (w, n) in enumerate(zip(windows, frames)):
        end = cached + n
        start = max(cached - w.cached, end - keep)
        out.append(
            KVWindow(
                stacked_keys[row, :, :, start:end].clone(),
                stacked_values[row, :, :, start:end].clone(),
                w.frames + n,
            )
        )
    return out
