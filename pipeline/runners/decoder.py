"""A decoder of HF layers (Qwen2-style or Qwen3-style: the thinker's text model, the talker's body, a code predictor)
run over a :class:`KVPool`.

The weights stay in the Hugging Face modules (norms, projections, q/k norms and MLPs, mixture-of-experts blocks
included, are called as they are, so the arithmetic is theirs); this module owns only what HF's cache classes cannot do
for us: every batch row at its own position in its own slot, and a decode step with fixed shapes that a CUDA graph can
capture. The structure is read from the modules: a layer's attention applies ``q_norm``/``k_norm`` (RMSNorm over the
head dimension, before the rotation) when it has them; the MLP is called on a (1, N, H) view (HF's MoE blocks want a
batch dimension).

Positions: a position has a KV cache index (where its key/value is stored; attention is causal in it) and a rope
position on each of the three TMRoPE axes (time, height, width). Without ``rope`` every axis equals the cache index.
With ``rope`` (3, N) int64 on the device, each head-dim channel rotates by the position of its axis. Which axis each
channel takes is read once from the HF rotary embedding itself (:func:`rope_axes`): Qwen2.5's ``mrope_section`` gives
contiguous blocks (time, then height, then width), Qwen3's interleaves them (height and width every third frequency);
a rotary without ``mrope_section`` (1-D rope) takes time for every channel. The cos/sin table is computed the way HF
computes it (float32 ``position * inv_freq``, cast to the model dtype) for rope positions ``0 .. rope_len - 1``, and a
row's cos/sin gathers each channel from its axis' position.

- :meth:`PooledDecoder.prefill`: one conversation, ``T`` positions from cache index ``start``, causal over the slot's
  first ``start + T`` positions. Eager (shapes vary).
- :meth:`PooledDecoder.decode`: ``B`` rows, one position each; with ``graph_safe`` the attention reads the
  lengths on the device (Triton), so the step can be captured, and, when the decoder was built with ``fuse`` and its
  layers have the Qwen2 structure, the layers run as the 9 kernels of :mod:`.fused_decode` instead of HF's ~37.
Both write the new keys/values into the pool before attending, and both can add deepstack features to the first
layers' outputs and return the hidden state of one layer as HF's ``output_hidden_states`` indexes them. Call under
``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import overload

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from pipeline.errors import CheckpointError
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

__all__ = ["HostRope", "PooledDecoder", "kv_geometry", "rope_axes"]

HostRope = torch.Tensor | np.ndarray
"""(3, T) int64 rope positions on the host, a tensor or a numpy array (:meth:`PooledDecoder.check_host_rope`)."""

PrefillDeepstack = Sequence[tuple[torch.Tensor, torch.Tensor]]
"""Deepstack features of a prefill: entry ``i`` is ``(rows, features)`` for layer ``i`` (the first ``k`` layers):
``rows`` (n,) int64 indices into the span's T rows, ``features`` (n, H), added to layer ``i``'s output there."""


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.no_grad()
def rope_axes(rotary, head_dim: int) -> torch.Tensor:
    """(head_dim,) int64 on the CPU: the rope axis (0 time, 1 height, 2 width) each head-dim channel of the HF rotary
    embedding ``rotary`` rotates by. A rotary without ``mrope_section`` is 1-D (every channel: time). A multimodal one
    is asked: position ids (3, 3, 1) with batch row ``b`` at position 1 on axis ``b`` and 0 on the others, so a
    channel's sine is nonzero exactly in the row of its axis (``sin(inv_freq) != 0`` for every frequency). Raises
    :class:`~pipeline.errors.CheckpointError` if a channel follows no axis or several."""
    if getattr(rotary, "mrope_section", None) is None:
        return torch.zeros(head_dim, dtype=torch.long)
    device = rotary.inv_freq.device
    probe = torch.eye(3, dtype=torch.long, device=device).view(3, 3, 1)
    _, sin = rotary(torch.zeros(1, dtype=torch.float32, device=device), probe)  # (3 rows, 1, D)
    moved = (sin[:, 0, :] != 0).cpu()
    if moved.shape != (3, head_dim) or not (moved.sum(0) == 1).all():
        raise CheckpointError(
            f"the rotary embedding {type(rotary).__name__} does not rotate each of the {head_dim} head-dim channels by "
            "exactly one of the three rope axes"
        )
    return moved.long().argmax(0)


def _contiguous_sections(axes: torch.Tensor) -> tuple[int, int] | None:
    """``(time, height)`` frequency counts when the channels take time, then height, then width in blocks, both halves
    of the head alike (the layout the fused RoPE kernel reproduces); None for any other layout (interleaved)."""
    half = axes.shape[0] // 2
    first = axes[:half].tolist()
    if axes[half:].tolist() != first or first != sorted(first):
        return None
    return first.count(0), first.count(1)


def kv_geometry(body) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of the KV pool a :class:`PooledDecoder` over ``body`` (an HF decoder model)
    allocates, read from its modules as the decoder reads them (sizing a pool before building it:
    :mod:`pipeline.runners.kv_sizing`)."""
    cfg = body.config
    attn = body.layers[0].self_attn
    head_dim = (
        getattr(attn, "head_dim", None) or getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    )
    return len(body.layers), cfg.num_key_value_heads, head_dim


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
        ``q_proj/k_proj/v_proj/o_proj`` and possibly ``q_norm/k_norm``, ``post_attention_layernorm``, ``mlp``),
        ``norm`` and ``rotary_emb``. ``fuse``: concatenate each layer's q/k/v and gate/up weights (in place, no extra
        memory) so that graph-safe decode steps run the fused kernels; ignored (``self.fused`` is None) unless every
        layer has the Qwen2 structure (:func:`~pipeline.kernels.fused_decode.fusable`) and the rope axes are contiguous
        blocks. ``rope_len``: rope positions the cos/sin table covers (default ``max_len``; rope positions after
        pictures run behind the cache index, video's time axis may run ahead of it). Raises
        :class:`~pipeline.errors.CheckpointError` for layers this decoder cannot run (sliding-window attention)."""
        cfg = body.config
        self.layers = list(body.layers)
        self.norm = body.norm
        self.heads = cfg.num_attention_heads
        _, self.kv_heads, self.head_dim = kv_geometry(body)
        self.scale = self.head_dim**-0.5
        self.device, self.dtype = torch.device(device), dtype
        for i, layer in enumerate(self.layers):
            window = getattr(layer.self_attn, "sliding_window", None)
            if window is not None and window < max_len:
                raise CheckpointError(f"layer {i} attends within a sliding window of {window} positions: unsupported")
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
        axes = rope_axes(rotary, self.head_dim)
        self.rope_axes = axes.to(self.device)
        """(D,) the rope axis of each head-dim channel."""
        self.mrope_section = _contiguous_sections(axes)
        """Frequencies on the time axis, then on the height axis (the rest: width), when the axes are contiguous
        blocks; None when they interleave."""
        self.fused: list[FusedLayer] | None = None
        if (
            fuse
            and self.mrope_section is not None
            and all(fusable(layer) for layer in self.layers)
            and hasattr(self.norm, "variance_epsilon")
        ):
            self.fused = [fuse_layer_weights(layer) for layer in self.layers]

    # -- public -----------------------------------------------------------------------------------
    @overload
    def prefill(
        self,
        slot: int,
        x: torch.Tensor,
        start: int,
        rope: torch.Tensor | None = None,
        *,
        deepstack: PrefillDeepstack | None = None,
        capture_layer: None = None,
    ) -> torch.Tensor: ...
    @overload
    def prefill(
        self,
        slot: int,
        x: torch.Tensor,
        start: int,
        rope: torch.Tensor | None = None,
        *,
        deepstack: PrefillDeepstack | None = None,
        capture_layer: int,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    def prefill(
        self,
        slot: int,
        x: torch.Tensor,
        start: int,
        rope: torch.Tensor | None = None,
        *,
        deepstack: PrefillDeepstack | None = None,
        capture_layer: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x`` (T, H) at cache indices ``start .. start+T-1`` of ``slot``, rope positions ``rope`` (3, T) int64 on
        the device (None: the cache indices); returns (T, H) after the final norm. With fused weights (``fuse`` on
        CUDA) the layers use the fused kernels around the same attention.

        ``deepstack``: per layer ``i`` of the first ``len(deepstack)``, ``(rows, features)``: ``features`` (n, H) are
        added to layer ``i``'s output at the span's rows ``rows`` ((n,) int64 on the device, distinct), as HF's
        ``_deepstack_process`` adds the visual features at ``visual_pos_masks`` (the features cast to the model dtype,
        one addition). ``capture_layer``: also return HF's ``output_hidden_states`` entry of that index, then the
        result is ``(hidden, captured)`` with captured (T, H): index 0 is the input ``x``, index ``k`` in
        ``1 .. layers-1`` layer ``k-1``'s output before its deepstack addition (HF records the layer's output), index
        ``layers`` the final-normed output (HF ties the last entry to it)."""
        t = x.shape[0]
        end = start + t
        if end > self.pool.max_len:
            raise ValueError(f"positions up to {end} exceed the KV pool's {self.pool.max_len}")
        self._check_rope(rope, t)
        self._check_extras(len(deepstack) if deepstack is not None else 0, capture_layer)
        # query i (absolute start+i) sees keys 0..start+i
        mask = torch.arange(end, device=self.device)[None, :] <= torch.arange(start, end, device=self.device)[:, None]
        # Grouped-query attention without copying the cache: the `group` query heads that share a kv head become
        # extra query rows of that head (rows ordered (g, t), the mask tiled the same way).
        mask = mask.repeat(self.heads // self.kv_heads, 1)
        if self.fused is not None and deepstack is None and capture_layer is None:
            return self._prefill_fused(slot, x, start, mask, rope)
        if rope is None:
            cos, sin = self.cos[start:end].unsqueeze(1), self.sin[start:end].unsqueeze(1)  # (T, 1, D)
        else:
            cos, sin = self._rotation(None, rope)

        def store(i: int, k: torch.Tensor, v: torch.Tensor) -> None:
            self.pool.keys[i][slot, start:end] = k
            self.pool.values[i][slot, start:end] = v

        added = deepstack if deepstack is not None else ()

        def add(i: int, h: torch.Tensor) -> torch.Tensor:
            rows, features = added[i]
            return h.index_put((rows,), h[rows] + features.to(h.dtype))  # out of place: a captured h stays as it was

        hidden, captured = self._eager_layers(
            x,
            cos,
            sin,
            store,
            lambda i, q: self._prefill_attention(i, q, slot, end, mask),
            add,
            len(added),
            capture_layer,
        )
        return self._with_captured(hidden, captured, capture_layer)

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

    @overload
    def decode(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        rope: torch.Tensor | None = None,
        *,
        graph_safe: bool = False,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture_layer: None = None,
    ) -> torch.Tensor: ...
    @overload
    def decode(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        rope: torch.Tensor | None = None,
        *,
        graph_safe: bool = False,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture_layer: int,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    def decode(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        rope: torch.Tensor | None = None,
        *,
        graph_safe: bool = False,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture_layer: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x`` (B, H), row b at cache index ``positions[b]`` of slot ``slots[b]`` with rope positions ``rope[:, b]``
        (``rope`` (3, B); None: the cache indices) (int64 tensors on the device); returns (B, H) after the final
        norm. Rows of one slot attend causally by cache index (a graphed prefill's rows).

        ``deepstack``: (B, H) tensors, the ``i``-th added to layer ``i``'s output (zero rows where a row has no
        features: adding 0 leaves a value as it is, so this equals HF's masked addition and keeps shapes fixed for a
        graph). ``capture_layer``: also return that ``output_hidden_states`` entry, (B, H), as for :meth:`prefill`.
        With either, the step runs the HF layers even when fused weights exist."""
        self._check_extras(len(deepstack) if deepstack is not None else 0, capture_layer)
        if graph_safe and self.fused is not None and deepstack is None and capture_layer is None:
            return self.decode_fused(x, slots, positions, rope)
        cos, sin = self._rotation(positions if rope is None else None, rope)
        lengths = positions + 1
        attend = attend_triton if graph_safe else attend_reference
        rows = x.shape[0]

        def store(i: int, k: torch.Tensor, v: torch.Tensor) -> None:
            self.pool.keys[i][slots, positions] = k
            self.pool.values[i][slots, positions] = v

        def attention(i: int, q: torch.Tensor) -> torch.Tensor:
            att = attend(q.contiguous(), self.pool.keys[i], self.pool.values[i], slots, lengths, self.scale)
            return att.reshape(rows, -1)

        added = deepstack if deepstack is not None else ()
        hidden, captured = self._eager_layers(
            x,
            cos,
            sin,
            store,
            attention,
            lambda i, h: h + added[i].to(h.dtype),
            len(added),
            capture_layer,
        )
        return self._with_captured(hidden, captured, capture_layer)

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

    def _eager_layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        store: Callable[[int, torch.Tensor, torch.Tensor], None],
        attend: Callable[[int, torch.Tensor], torch.Tensor],
        add: Callable[[int, torch.Tensor], torch.Tensor],
        added_layers: int,
        capture_layer: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every layer through the HF modules over rows ``x`` (N, H) rotated by ``cos``/``sin`` (N, 1, D):
        ``store(layer, k, v)`` writes the rows' keys/values (N, kv_heads, D) before ``attend(layer, q)`` maps the
        queries (N, heads, D) to (N, heads * D); ``add(layer, h)`` adds the deepstack features to the outputs of the
        first ``added_layers`` layers. Returns the final-normed rows and the ``capture_layer`` hidden state (None
        without one)."""
        h = x.to(self.dtype)
        captured = h if capture_layer == 0 else None
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, cos, sin)
            store(i, k, v)
            h = self._finish_layer(layer, h, attend(i, q))
            if capture_layer == i + 1:
                captured = h  # HF records the layer's output before the deepstack addition
            if i < added_layers:
                h = add(i, h)
        out = self.norm(h)
        return out, out if capture_layer == len(self.layers) else captured

    @staticmethod
    def _with_captured(
        hidden: torch.Tensor, captured: torch.Tensor | None, capture_layer: int | None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """What :meth:`prefill` and :meth:`decode` return: ``hidden``, or with a ``capture_layer`` (checked to lie in
        the layers, so :meth:`_eager_layers` captured it) ``(hidden, captured)``."""
        if capture_layer is None:
            return hidden
        assert captured is not None, "every capture_layer in range is captured"
        return hidden, captured

    def _check_extras(self, deepstack_layers: int, capture_layer: int | None) -> None:
        if deepstack_layers > len(self.layers):
            raise ValueError(f"deepstack features for {deepstack_layers} layers, the decoder has {len(self.layers)}")
        if capture_layer is not None and not 0 <= capture_layer <= len(self.layers):
            raise ValueError(f"capture_layer must lie in [0, {len(self.layers)}], got {capture_layer}")

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
        if self.fused is None:
            raise ValueError("fused decode needs a decoder built with fuse=True over fusable layers")
        rope = positions.view(1, -1).expand(3, -1) if rope is None else rope
        residual = x.to(self.dtype).contiguous()
        delta: torch.Tensor | None = None  # what the previous sublayer adds to the residual stream
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
        assert delta is not None, "a decoder has layers (its first one is read at construction)"
        out, _ = add_rms_norm(delta, self.norm.weight, float(self.norm.variance_epsilon), residual)
        return out

    # -- rotation ---------------------------------------------------------------------------------
    def check_host_rope(self, rope: HostRope | None, rows: int) -> None:
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
        if getattr(attn, "q_norm", None) is not None:  # Qwen3: RMSNorm over each head, before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    @staticmethod
    def _finish_layer(layer, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        h = h + layer.self_attn.o_proj(att)
        # HF's MoE blocks unpack (batch, sequence, hidden): the rows as one sequence
        return h + layer.mlp(layer.post_attention_layernorm(h).unsqueeze(0)).squeeze(0)
