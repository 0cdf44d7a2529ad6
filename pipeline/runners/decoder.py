"""A Qwen2-style decoder (the thinker's text model or the talker's body) run over a :class:`KVPool`.

The weights stay in the Hugging Face modules (norms, projections and MLPs are called as they are, so the
arithmetic is theirs); this module owns only what HF's cache classes cannot do for us: every batch row at its
own position in its own slot, and a decode step with fixed shapes that a CUDA graph can capture.

Positions: a position has a KV cache index (where its key/value is stored; attention is causal in it) and a rope
position on each of the three TMRoPE axes (time, height, width). Without ``rope`` every axis equals the cache index.
With ``rope`` (3, N) int64 on the device, frequency ``j`` of the head dimension rotates by the axis its
``mrope_section`` assigns it (the first ``s0`` frequencies time, the next ``s1`` height, the rest width; both halves of
the head the same), as HF's multimodal rotary embedding does; a decoder without ``mrope_section`` (1-D rope) takes
time for every frequency. The cos/sin table is computed the way HF computes it (float32 ``position * inv_freq``, cast
to the model dtype) for rope positions ``0 .. rope_len - 1``, and a row's cos/sin gathers each frequency from its
axis' position.

- :meth:`PooledDecoder.prefill`: one conversation, ``T`` positions from cache index ``start``, causal over the slot's
  first ``start + T`` positions. Eager (shapes vary).
- :meth:`PooledDecoder.decode`: ``B`` rows, one position each; with ``graph_safe`` the attention reads the
  lengths on the device (Triton), so the step can be captured, and, when the decoder was built with ``fuse``,
  the layers run as the 9 kernels of :mod:`.fused_decode` instead of HF's ~37.
Both write the new keys/values into the pool before attending. Call under ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from pipeline.kernels.decode_attention import attend_reference, attend_triton
from pipeline.kernels.fused_decode import (
    FusedLayer,
    add_rms_norm,
    fusable,
    fuse_layer_weights,
    rope_and_store,
    silu_mul,
)
from pipeline.kernels.sdpa import PREFILL_BACKENDS
from pipeline.runners.kv_pool import KVPool

__all__ = ["PooledDecoder"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PooledDecoder:
    def __init__(
        self,
        body,
        *,
        slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        fuse: bool = False,
        rope_len: int | None = None,
    ) -> None:
        """``body``: an HF decoder model with ``layers`` (each with ``input_layernorm``, ``self_attn`` having
        ``q_proj/k_proj/v_proj/o_proj``, ``post_attention_layernorm``, ``mlp``), ``norm`` and ``rotary_emb``.
        ``fuse``: concatenate each layer's q/k/v and gate/up weights (in place, no extra memory) so that graph-safe
        decode steps run the fused kernels; ignored (``self.fused`` is None) for layers of another structure.
        ``rope_len``: rope positions the cos/sin table covers (default ``max_len``; rope positions after pictures
        run behind the cache index, video's time axis may run ahead of it)."""
        cfg = body.config
        self.layers = list(body.layers)
        self.norm = body.norm
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.device, self.dtype = torch.device(device), dtype
        self.pool = KVPool(
            layers=len(self.layers),
            slots=slots,
            max_len=max_len,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            dtype=dtype,
            device=device,
        )
        rotary = body.rotary_emb
        self.rope_len = rope_len or max_len
        positions = torch.arange(self.rope_len, device=self.device, dtype=torch.float32)
        freqs = positions[:, None] * rotary.inv_freq.to(self.device, torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = getattr(rotary, "attention_scaling", 1.0)
        self.cos = (emb.cos() * scaling).to(dtype)  # (max_len, D)
        self.sin = (emb.sin() * scaling).to(dtype)
        half = self.head_dim // 2
        section = list(getattr(rotary, "mrope_section", None) or [half, 0, 0])
        if len(section) != 3 or sum(section) != half:
            raise ValueError(f"mrope_section {section} must be three sizes summing to head_dim / 2 = {half}")
        self.mrope_section = (section[0], section[1])
        """Frequencies on the time axis, then on the height axis (the rest: width)."""
        axes = torch.tensor([0] * section[0] + [1] * section[1] + [2] * section[2], device=self.device)
        self.rope_axes = torch.cat([axes, axes])
        """(D,) the rope axis of each head-dim channel."""
        self.fused: list[FusedLayer] | None = None
        if fuse and all(fusable(layer) for layer in self.layers) and hasattr(self.norm, "variance_epsilon"):
            self.fused = [fuse_layer_weights(layer) for layer in self.layers]

    # -- public -----------------------------------------------------------------------------------
    def prefill(self, slot: int, x: torch.Tensor, start: int, rope: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (T, H) at cache indices ``start .. start+T-1`` of ``slot``, rope positions ``rope`` (3, T) int64 on
        the device (None: the cache indices); returns (T, H) after the final norm. With fused weights (``fuse`` on
        CUDA) the layers use the fused kernels around the same attention."""
        t = x.shape[0]
        end = start + t
        if end > self.pool.max_len:
            raise ValueError(f"positions up to {end} exceed the KV pool's {self.pool.max_len}")
        self._check_rope(rope, t)
        # query i (absolute start+i) sees keys 0..start+i
        mask = torch.arange(end, device=self.device)[None, :] <= torch.arange(start, end, device=self.device)[:, None]
        # Grouped-query attention without copying the cache: the `group` query heads that share a kv head become
        # extra query rows of that head (rows ordered (g, t), the mask tiled the same way).
        mask = mask.repeat(self.heads // self.kv_heads, 1)
        if self.fused is not None:
            return self._prefill_fused(slot, x, start, mask, rope)
        if rope is None:
            cos, sin = self.cos[start:end].unsqueeze(1), self.sin[start:end].unsqueeze(1)  # (T, 1, D)
        else:
            cos, sin = self._rotation(None, rope)
        h = x.to(self.dtype)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, cos, sin)  # (T, heads, D)
            self.pool.keys[i][slot, start:end] = k
            self.pool.values[i][slot, start:end] = v
            h = self._finish_layer(layer, h, self._prefill_attention(i, q, slot, end, mask))
        return self.norm(h)

    def _prefill_fused(
        self, slot: int, x: torch.Tensor, start: int, mask: torch.Tensor, rope: torch.Tensor | None
    ) -> torch.Tensor:
        t = x.shape[0]
        slots = torch.full((t,), slot, dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + t, device=self.device)
        return self._fused_layers(
            x, slots, positions, rope, lambda i, q: self._prefill_attention(i, q, slot, start + t, mask)
        )

    def _prefill_attention(self, layer: int, q: torch.Tensor, slot: int, end: int, mask: torch.Tensor) -> torch.Tensor:
        """Queries (T, heads, D) of the last T positions before ``end`` over the slot's first ``end`` positions
        (their keys/values already written); returns (T, heads * D)."""
        t, group = q.shape[0], self.heads // self.kv_heads
        keys = self.pool.keys[layer][slot, :end].transpose(0, 1).unsqueeze(0)  # (1, Hkv, S, D), a view
        values = self.pool.values[layer][slot, :end].transpose(0, 1).unsqueeze(0)
        q = q.view(t, self.kv_heads, group, self.head_dim).permute(1, 2, 0, 3)
        q = q.reshape(1, self.kv_heads, group * t, self.head_dim)
        with sdpa_kernel(PREFILL_BACKENDS):
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        return att.view(self.kv_heads, group, t, self.head_dim).permute(2, 0, 1, 3).reshape(t, -1)

    def decode(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        rope: torch.Tensor | None = None,
        *,
        graph_safe: bool = False,
    ) -> torch.Tensor:
        """``x`` (B, H), row b at cache index ``positions[b]`` of slot ``slots[b]`` with rope positions ``rope[:, b]``
        (``rope`` (3, B); None: the cache indices) (int64 tensors on the device); returns (B, H) after the final
        norm. Rows of one slot attend causally by cache index (a graphed prefill's rows)."""
        if graph_safe and self.fused is not None:
            return self.decode_fused(x, slots, positions, rope)
        cos, sin = self._rotation(positions if rope is None else None, rope)
        lengths = positions + 1
        attend = attend_triton if graph_safe else attend_reference
        h = x.to(self.dtype)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, cos, sin)  # (B, heads, D)
            self.pool.keys[i][slots, positions] = k
            self.pool.values[i][slots, positions] = v
            att = attend(q.contiguous(), self.pool.keys[i], self.pool.values[i], slots, lengths, self.scale)
            h = self._finish_layer(layer, h, att.reshape(x.shape[0], -1))
        return self.norm(h)

    def decode_fused(
        self, x: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor | None = None
    ) -> torch.Tensor:
        """:meth:`decode` in 9 kernels per layer (:mod:`.fused_decode`); needs ``fuse`` and Triton. Same contract."""
        lengths = positions + 1
        rows = x.shape[0]
        return self._fused_layers(
            x,
            slots,
            positions,
            rope,
            lambda i, q: attend_triton(q, self.pool.keys[i], self.pool.values[i], slots, lengths, self.scale).reshape(
                rows, -1
            ),
        )

    def _fused_layers(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        rope: torch.Tensor | None,
        attend: Callable[[int, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Every layer through the fused kernels: row r of ``x`` (R, H) at ``positions[r]`` of ``slots[r]`` (its key
        and value written there), rotated by ``rope[:, r]`` (None: ``positions[r]``); ``attend(layer, q)`` maps the
        rotated queries (R, heads, D) to (R, heads * D)."""
        rope = positions.view(1, -1).expand(3, -1) if rope is None else rope
        residual = x.to(self.dtype).contiguous()
        delta = None  # what the previous sublayer adds to the residual stream
        for i, w in enumerate(self.fused):
            normed, residual = add_rms_norm(
                delta if delta is not None else residual, w.input_norm, w.eps, residual if delta is not None else None
            )
            q = rope_and_store(
                F.linear(normed, w.qkv_weight, w.qkv_bias),
                self.cos,
                self.sin,
                self.pool.keys[i],
                self.pool.values[i],
                slots,
                positions,
                rope,
                heads=self.heads,
                kv_heads=self.kv_heads,
                mrope_section=self.mrope_section,
            )
            normed, residual = add_rms_norm(w.o_proj(attend(i, q)), w.post_norm, w.eps, residual)
            delta = w.down_proj(silu_mul(F.linear(normed, w.gate_up_weight)))
        out, _ = add_rms_norm(delta, self.norm.weight, float(self.norm.variance_epsilon), residual)
        return out

    # -- rotation ---------------------------------------------------------------------------------
    def check_host_rope(self, rope, rows: int) -> None:
        """Host rope positions (a (3, ``rows``) tensor or numpy array; None: the cache indices) must have that shape
        and lie inside the cos/sin table (checked on the host, before anything is queued)."""
        if rope is None:
            return
        if tuple(rope.shape) != (3, rows):
            raise ValueError(f"rope positions must have shape (3, {rows}), got {tuple(rope.shape)}")
        if rows and (int(rope.min()) < 0 or int(rope.max()) >= self.rope_len):
            raise ValueError(f"rope positions must lie in [0, {self.rope_len}), got up to {int(rope.max())}")

    def _check_rope(self, rope: torch.Tensor | None, rows: int) -> None:
        if rope is not None and tuple(rope.shape) != (3, rows):
            raise ValueError(f"rope positions must have shape (3, {rows}), got {tuple(rope.shape)}")

    def _rotation(self, positions: torch.Tensor | None, rope: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (N, 1, D) of N rows: at rope position ``positions`` on every axis, or at ``rope`` (3, N), each
        channel from its axis (graph-safe: a gather, no host sync)."""
        if rope is None:
            return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        index = rope[self.rope_axes].T  # (N, D): the rope position each channel of each row rotates by
        return self.cos.gather(0, index).unsqueeze(1), self.sin.gather(0, index).unsqueeze(1)

    # -- layer parts ------------------------------------------------------------------------------
    def _qkv(self, layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        attn = layer.self_attn
        n = layer.input_layernorm(h)
        q = attn.q_proj(n).view(h.shape[0], self.heads, self.head_dim)
        k = attn.k_proj(n).view(h.shape[0], self.kv_heads, self.head_dim)
        v = attn.v_proj(n).view(h.shape[0], self.kv_heads, self.head_dim)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    @staticmethod
    def _finish_layer(layer, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        h = h + layer.self_attn.o_proj(att)
        return h + layer.mlp(layer.post_attention_layernorm(h))
