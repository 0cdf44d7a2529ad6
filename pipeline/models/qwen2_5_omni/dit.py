"""The DiT's velocity field for the streaming synthesizer, and the ODE solver that integrates it.

transformers' DiT recomputes, in every one of a chunk's 36 velocity evaluations and in each of its 22 blocks, what
does not depend on the evaluation's state: the time embedding and each block's adaptive-norm modulation (functions
of the ODE time alone, and the times are fixed by the config), and the attention mask (a function of the window's
block layout alone). It also runs three query/key/value products and rebuilds the RoPE head by slice assignment.
On a GPU each of those is a kernel (and the mask one per block and evaluation): 442 kernels an evaluation
(H100). Here:

- :class:`TimeModulation`: the modulation of every block and of the output norm at every evaluation time,
  computed once per synthesizer (a table indexed by the evaluation's number);
- :func:`dit_velocity`: the masks of a window's attention reaches built once per solve;
- :func:`dit_block`: one block with a single query/key/value product and the RoPE head rebuilt by concatenation,
  the unit that :class:`CompiledDitBlock` compiles (one graph for every block: weights, modulation and mask are
  inputs);
- :func:`dit_block_triton`: the same block with its attention (RoPE, mask, softmax, layout) in one Triton kernel
  (:mod:`.dit_attention`), which takes each frame's block id and the layer's reach instead of a mask
  (:class:`DitAttention`; the packaged choice on CUDA).

The arithmetic is transformers' (``DiTDecoderLayer``, ``DiTAttention`` with its RoPE on the first head over the
deinterleaved head dimension, ``Qwen2_5_OmniAdaLayerNormZero`` and its ``_Final``); ``test_token2wav_stream`` checks
streamed windows against the model's own forward to float rounding.
"""

from __future__ import annotations

import copy
import enum
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.errors import ConfigError
from pipeline.models.qwen2_5_omni.dit_attention import dit_attention

__all__ = [
    "DIT_DTYPES",
    "CompiledDitBlock",
    "DitAttention",
    "DitBlock",
    "DitLayer",
    "DitWeights",
    "TimeModulation",
    "Velocity",
    "WindowInputs",
    "dit_block",
    "dit_block_triton",
    "dit_velocity",
    "dit_weights",
    "evaluation_times",
    "guided",
    "integrate",
    "sdpa_attention",
]

DIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Precisions the DiT's transformer can compute in (``dit_dtype``)."""

NORM_EPS = 1e-6
"""The DiT's layer norms (no affine parameters; the modulation scales and shifts)."""

Velocity = Callable[[int, Tensor, Tensor], Tensor]
"""``(evaluation number, t, x) -> dx/dt``: the evaluations of one solve are numbered 0, 1, ... in the order
:func:`integrate` makes them, the same for every solve with the same time points."""


def integrate(velocity: Velocity, y0: Tensor, times: Tensor) -> Tensor:
    """Fixed-step RK4 (Kutta's 3/8 rule) from ``times[0]`` to ``times[-1]``; the reference's solver. Evaluation
    ``4 * i + j`` is stage ``j`` of interval ``i``."""
    y = y0
    for i, (t0, t1) in enumerate(zip(times[:-1], times[1:])):
        h = t1 - t0
        k1 = velocity(4 * i, t0, y)
        k2 = velocity(4 * i + 1, t0 + h / 3, y + h * k1 / 3)
        k3 = velocity(4 * i + 2, t0 + 2 * h / 3, y + h * (k2 - k1 / 3))
        k4 = velocity(4 * i + 3, t1, y + h * (k1 - k2 + k3))
        y = y + (k1 + 3 * (k2 + k3) + k4) * h / 8
    return y


def evaluation_times(times: Tensor) -> list[Tensor]:
    """The time of each velocity evaluation of :func:`integrate` over ``times``, in evaluation order, computed by
    the solver's own expressions (so that they are the very values a solve passes)."""
    seen: list[Tensor] = []

    def record(number: int, t: Tensor, x: Tensor) -> Tensor:
        seen.append(t)
        return x

    integrate(record, torch.zeros((), device=times.device), times)
    return seen


# ---------------------------------------------------------------------------------------------------
# Weights


@dataclass(frozen=True)
class DitLayer:
    """One block's weights in the compute dtype: the query/key/value projections concatenated (3 * inner, dim), the
    output projection, the feed-forward pair, the adaptive norm's modulation projection (dim -> 6 * dim: shift,
    scale and gate for the attention, then for the feed-forward) and the block's attention reach in blocks
    (``look_ahead``, ``look_back``)."""

    qkv_weight: Tensor
    qkv_bias: Tensor
    out_weight: Tensor
    out_bias: Tensor
    ff_in_weight: Tensor
    ff_in_bias: Tensor
    ff_out_weight: Tensor
    ff_out_bias: Tensor
    modulation_weight: Tensor
    modulation_bias: Tensor
    look_ahead: int
    look_back: int
    reach_bounds: Tensor
    """(look_ahead, look_back) as a (2,) int64 tensor on the weights' device, for the Triton attention: made here, once,
    because a solve is captured in a CUDA graph, where a host-to-device copy cannot be recorded."""

    @property
    def reach(self) -> tuple[int, int]:
        return self.look_ahead, self.look_back


@dataclass(frozen=True)
class DitWeights:
    """What one velocity evaluation runs, and the dtype the transformer computes in. The time embedding stays the
    model's float32 module (the flow-matching time must keep its precision: bfloat16 would round it to ~3 digits);
    everything else is in ``dtype`` (the model's own tensors for float32 but the concatenated query/key/value
    projection, copies otherwise, so the model stays float32 for anything else that uses it). Taken when the
    synthesizer is made, as the :class:`TimeModulation` table is: later changes to the model's weights are not seen.
    The ODE state, the conditioning features and the RoPE tables stay
    float32 outside; each evaluation casts its inputs and returns a float32 velocity, so the RK4 sums accumulate in
    float32."""

    time_embed: torch.nn.Module
    input_proj: torch.nn.Module
    layers: tuple[DitLayer, ...]
    out_modulation_weight: Tensor
    out_modulation_bias: Tensor
    proj_out: torch.nn.Module
    heads: int
    block_size: int
    """Frames per attention block (the model's ``block_size``)."""
    dtype: torch.dtype

    @property
    def reaches(self) -> set[tuple[int, int]]:
        return {layer.reach for layer in self.layers}


def _layer(block, dtype: torch.dtype) -> DitLayer:
    attn, ff = block.attn, block.ff.ff
    cast = lambda tensor: tensor.detach().to(dtype)  # noqa: E731 - a no-op (the model's tensor) for float32
    return DitLayer(
        qkv_weight=torch.cat([cast(attn.to_q.weight), cast(attn.to_k.weight), cast(attn.to_v.weight)]),
        qkv_bias=torch.cat([cast(attn.to_q.bias), cast(attn.to_k.bias), cast(attn.to_v.bias)]),
        out_weight=cast(attn.to_out[0].weight),
        out_bias=cast(attn.to_out[0].bias),
        ff_in_weight=cast(ff[0].weight),
        ff_in_bias=cast(ff[0].bias),
        ff_out_weight=cast(ff[3].weight),
        ff_out_bias=cast(ff[3].bias),
        modulation_weight=cast(block.attn_norm.linear.weight),
        modulation_bias=cast(block.attn_norm.linear.bias),
        look_ahead=block.look_ahead_block,
        look_back=block.look_backward_block,
        reach_bounds=torch.tensor([block.look_ahead_block, block.look_backward_block], device=attn.to_q.weight.device),
    )


def dit_weights(dit, dtype: torch.dtype) -> DitWeights:
    """The weights of ``dit`` (transformers' ``Qwen2_5OmniToken2WavDiTModel``) for computing in ``dtype``."""
    if dtype not in DIT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DIT_DTYPES)
        raise ConfigError(f"dit_dtype must be one of {names}, got {dtype}", param="dit_dtype")
    with torch.no_grad():
        layers = tuple(_layer(block, dtype) for block in dit.transformer_blocks)
        input_proj, proj_out = dit.input_embed.proj, dit.proj_out
        if dtype != torch.float32:
            input_proj, proj_out = copy.deepcopy(input_proj).to(dtype), copy.deepcopy(proj_out).to(dtype)
        out_linear = dit.norm_out.linear
        return DitWeights(
            time_embed=dit.time_embed,
            input_proj=input_proj,
            layers=layers,
            out_modulation_weight=out_linear.weight.detach().to(dtype),
            out_modulation_bias=out_linear.bias.detach().to(dtype),
            proj_out=proj_out,
            heads=dit.transformer_blocks[0].attn.heads,
            block_size=dit.block_size,
            dtype=dtype,
        )


@dataclass(frozen=True)
class TimeModulation:
    """Every evaluation's modulation, in the compute dtype: ``blocks`` (evaluations, layers, 6, dim) as each block's
    adaptive norm makes it (shift, scale, gate for the attention; shift, scale, gate for the feed-forward), ``out``
    (evaluations, 2, dim) as the output norm makes it (scale, shift)."""

    blocks: Tensor
    out: Tensor

    @classmethod
    def build(cls, weights: DitWeights, times: Tensor) -> TimeModulation:
        """The table for the evaluations of a solve over ``times`` (the synthesizer's ODE time points)."""
        blocks, out = [], []
        with torch.inference_mode():
            for t in evaluation_times(times):
                embedded = F.silu(weights.time_embed(t.reshape(1)).to(weights.dtype))
                blocks.append(
                    torch.stack(
                        [
                            F.linear(embedded, layer.modulation_weight, layer.modulation_bias).reshape(6, -1)
                            for layer in weights.layers
                        ]
                    )
                )
                out_modulation = F.linear(embedded, weights.out_modulation_weight, weights.out_modulation_bias)
                out.append(out_modulation.reshape(2, -1))
        return cls(blocks=torch.stack(blocks), out=torch.stack(out))


# ---------------------------------------------------------------------------------------------------
# One block, and the velocity field


def _rope_head(head: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """transformers' RoPE of the DiT's first head: the head dimension deinterleaved, then the half-split rotation.
    ``head`` (rows, 1, L, head_dim), ``cos``/``sin`` (rows, L, head_dim)."""
    head = torch.cat((head[..., 0::2], head[..., 1::2]), dim=-1)
    half = head.shape[-1] // 2
    rotated = torch.cat((-head[..., half:], head[..., :half]), dim=-1)
    return head * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


class DitAttention(enum.Enum):
    """How a block attends: ``sdpa``, ``scaled_dot_product_attention`` over a (rows, 1, L, L) mask after RoPE and
    a concatenation (any device, any dtype); ``triton``, :func:`.dit_attention.dit_attention`, one kernel reading the
    query/key/value product and each frame's block id (CUDA, half precision)."""

    SDPA = "sdpa"
    TRITON = "triton"


def _attention_input(hidden: Tensor, shift: Tensor, scale: Tensor, qkv_weight: Tensor, qkv_bias: Tensor) -> Tensor:
    """The modulated norm of (rows, L, dim) states through the query/key/value product: (rows, L, 3 * inner)."""
    normed = F.layer_norm(hidden, (hidden.shape[-1],), eps=NORM_EPS) * (1 + scale) + shift
    return F.linear(normed, qkv_weight, qkv_bias)


def _block_output(
    hidden: Tensor,
    attended: Tensor,
    modulation: Tensor,
    out_weight: Tensor,
    out_bias: Tensor,
    ff_in_weight: Tensor,
    ff_in_bias: Tensor,
    ff_out_weight: Tensor,
    ff_out_bias: Tensor,
) -> Tensor:
    """The rest of a block after its attention (``attended`` (rows, L, inner)): gated output projection, then the
    modulated feed-forward, each added to the residual stream."""
    _, _, gate_attn, shift_ff, scale_ff, gate_ff = modulation.unbind(0)
    hidden = hidden + gate_attn * F.linear(attended, out_weight, out_bias)
    normed = F.layer_norm(hidden, (hidden.shape[-1],), eps=NORM_EPS) * (1 + scale_ff) + shift_ff
    inner = F.gelu(F.linear(normed, ff_in_weight, ff_in_bias), approximate="tanh")
    return hidden + gate_ff * F.linear(inner, ff_out_weight, ff_out_bias)


def sdpa_attention(qkv: Tensor, mask: Tensor, cos: Tensor, sin: Tensor, heads: int) -> Tensor:
    """transformers' ``DiTAttention`` after its products: (rows, L, 3 * inner) query/key/value -> (rows, L, inner),
    the first head's queries and keys rotated, ``scaled_dot_product_attention`` over ``mask`` (rows, 1, L, L)."""
    rows, length, _ = qkv.shape
    query, key, value = qkv.view(rows, length, 3, heads, -1).transpose(1, 3).unbind(2)  # (rows, heads, L, head_dim)
    query = torch.cat([_rope_head(query[:, :1], cos, sin), query[:, 1:]], dim=1)
    key = torch.cat([_rope_head(key[:, :1], cos, sin), key[:, 1:]], dim=1)
    attended = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return attended.transpose(1, 2).reshape(rows, length, -1)


def dit_block(
    hidden: Tensor,
    modulation: Tensor,
    qkv_weight: Tensor,
    qkv_bias: Tensor,
    out_weight: Tensor,
    out_bias: Tensor,
    ff_in_weight: Tensor,
    ff_in_bias: Tensor,
    ff_out_weight: Tensor,
    ff_out_bias: Tensor,
    mask: Tensor,
    cos: Tensor,
    sin: Tensor,
    heads: int,
) -> Tensor:
    """One transformer block (transformers' ``DiTDecoderLayer``) over (rows, L, dim) states: ``modulation`` (6, dim)
    from :class:`TimeModulation`, ``mask`` (rows, 1, L, L) bool, True where a query may attend a key, ``cos``/``sin``
    (rows, L, head_dim) RoPE tables, all in the states' dtype but the mask."""
    qkv = _attention_input(hidden, modulation[0], modulation[1], qkv_weight, qkv_bias)
    attended = sdpa_attention(qkv, mask, cos, sin, heads)
    return _block_output(
        hidden, attended, modulation, out_weight, out_bias, ff_in_weight, ff_in_bias, ff_out_weight, ff_out_bias
    )


def dit_block_triton(
    hidden: Tensor,
    modulation: Tensor,
    qkv_weight: Tensor,
    qkv_bias: Tensor,
    out_weight: Tensor,
    out_bias: Tensor,
    ff_in_weight: Tensor,
    ff_in_bias: Tensor,
    ff_out_weight: Tensor,
    ff_out_bias: Tensor,
    blocks: Tensor,
    reach: Tensor,
    cos: Tensor,
    sin: Tensor,
    heads: int,
    block_size: int,
) -> Tensor:
    """:func:`dit_block` with its attention in one kernel (:func:`.dit_attention.dit_attention`): instead of a mask,
    ``blocks`` (rows, L) each frame's attention block and ``reach`` (2,) the layer's (look-ahead, look-back); windows
    start on a block boundary (of ``block_size`` frames)."""
    qkv = _attention_input(hidden, modulation[0], modulation[1], qkv_weight, qkv_bias)
    attended = dit_attention(qkv, cos, sin, blocks, reach, heads, block_size)
    return _block_output(
        hidden, attended, modulation, out_weight, out_bias, ff_in_weight, ff_in_bias, ff_out_weight, ff_out_bias
    )


# the two take different attention inputs (and sizes) after the weights: DitBlock passes them through
_BLOCK_FUNCTIONS: dict[DitAttention, Callable[..., Tensor]] = {
    DitAttention.SDPA: dit_block,
    DitAttention.TRITON: dit_block_triton,
}


class DitBlock:
    """Runs one transformer block eagerly, with the attention ``attention`` picks; :func:`dit_velocity` passes it the
    attention inputs that kind takes (a mask, or block ids and a reach) after the weights."""

    def __init__(self, attention: DitAttention = DitAttention.SDPA) -> None:
        self.attention = attention
        self._function = _BLOCK_FUNCTIONS[attention]

    def __call__(
        self, hidden: Tensor, modulation: Tensor, *weights_attention_rope: Tensor, heads: int, block_size: int
    ) -> Tensor:
        return self._function(hidden, modulation, *weights_attention_rope, **self._sizes(heads, block_size))

    def _sizes(self, heads: int, block_size: int) -> dict[str, int]:
        triton = self.attention is DitAttention.TRITON
        return {"heads": heads, "block_size": block_size} if triton else {"heads": heads}


class CompiledDitBlock(DitBlock):
    """:class:`DitBlock` through ``torch.compile`` (inductor).

    - Inductor's default mode: no CUDA graphs of its own (the synthesizer records the whole solve, compiled kernels
      included, in its own graphs).
    - Weights, modulation and the attention inputs are inputs, so one graph serves every block whatever its attention
      reach (with Triton attention, the reach is a device tensor for that reason).
    - Rows (streams x CFG branches) and frames are dynamic (marked on every call), so every window shape and batch
      size shares that graph: dynamo compiles a function at most 8 times (its recompile limit). A batch of a single
      row (no CFG, one stream) is specialized by dynamo (sizes 0 and 1 always are) and adds its own graph.
    - ``fullgraph=True``: a graph break, or the recompile limit, raises instead of silently running (part of) the
      block eagerly.
    - Each instance compiles its own copy of the function's code: dynamo keeps compiled graphs, and counts them
      against its limit, per code object, so synthesizers with different models or TF32 settings (a guarded global
      switch) in one process do not spend one shared budget.
    """

    def __init__(self, attention: DitAttention = DitAttention.SDPA) -> None:
        super().__init__(attention)
        source = self._function
        code = source.__code__.replace()  # a distinct code object, same bytecode
        function = types.FunctionType(code, source.__globals__, source.__name__, source.__defaults__)
        self._function = torch.compile(function, fullgraph=True, mode="default")
        # where the attention input whose dimensions follow the window sits among the arguments after the modulation:
        # the mask (rows, 1, L, L) before cos and sin, or the block ids (rows, L) before the reach, cos and sin
        self._attention_dims: tuple[int, ...]
        self._attention_at, self._attention_dims = (-3, (0, 2, 3)) if attention is DitAttention.SDPA else (-4, (0, 1))

    def __call__(
        self, hidden: Tensor, modulation: Tensor, *weights_attention_rope: Tensor, heads: int, block_size: int
    ) -> Tensor:
        torch._dynamo.mark_dynamic(hidden, (0, 1))
        for at, dims in ((self._attention_at, self._attention_dims), (-2, (0, 1)), (-1, (0, 1))):
            torch._dynamo.mark_dynamic(weights_attention_rope[at], dims)
        return self._function(hidden, modulation, *weights_attention_rope, **self._sizes(heads, block_size))


@dataclass(frozen=True)
class WindowInputs:
    """Everything the velocity field of a batch of windows needs besides (t, x), per row (rows are ``[conditioned...,
    unconditioned...]`` with CFG): ``features`` (rows, L, feat) float32; ``rope`` cos and sin (rows, L, head_dim)
    float32 at absolute positions; ``block_diff`` (rows, L, L), key block minus query block."""

    features: Tensor
    rope: tuple[Tensor, Tensor]
    block_diff: Tensor


def guided(prediction: Tensor, guidance_scale: float, use_cfg: bool) -> Tensor:
    """Classifier-free guidance over rows ``[conditioned..., unconditioned...]`` (the reference sampler's formula)."""
    if not use_cfg:
        return prediction
    conditioned, unconditioned = prediction.chunk(2, dim=0)
    return conditioned + (conditioned - unconditioned) * guidance_scale


def dit_velocity(
    weights: DitWeights,
    modulation: TimeModulation,
    window: WindowInputs,
    guidance_scale: float,
    use_cfg: bool,
    block: DitBlock | None = None,
) -> Velocity:
    """The guided velocity field of ``window``: (number, t, x (streams, L, mel_dim) float32) -> (streams, L, mel_dim)
    float32, every block run by ``block`` in ``weights.dtype``. The evaluation's number picks its row of
    ``modulation`` (t itself is not read: the table was built from the same time points). The casts of the RoPE tables
    and the attention inputs (with SDPA one mask per reach; with Triton the frames' block ids) are made here, once per
    solve."""
    rows, dtype = window.features.shape[0], weights.dtype
    block = block or DitBlock()
    cos, sin = (table.to(dtype) for table in window.rope)
    attention: dict[tuple[int, int], tuple[Tensor, ...]]  # a layer's reach -> its attention inputs
    if block.attention is DitAttention.TRITON:
        # key block minus the first frame's block: each frame's block id up to a per-row offset, as the kernel takes it
        blocks = window.block_diff[:, 0, :].contiguous()
        attention = {layer.reach: (blocks, layer.reach_bounds) for layer in weights.layers}
    else:
        attention = {
            (ahead, back): (((window.block_diff >= -back) & (window.block_diff <= ahead)).unsqueeze(1),)
            for ahead, back in weights.reaches
        }

    def velocity(number: int, t: Tensor, x: Tensor) -> Tensor:
        # x holds one row per stream; each stream's row feeds its conditioned and unconditioned rows.
        hidden = weights.input_proj(torch.cat([x.repeat(rows // x.shape[0], 1, 1), window.features], dim=-1).to(dtype))
        for layer, layer_modulation in zip(weights.layers, modulation.blocks[number]):
            hidden = block(
                hidden,
                layer_modulation,
                layer.qkv_weight,
                layer.qkv_bias,
                layer.out_weight,
                layer.out_bias,
                layer.ff_in_weight,
                layer.ff_in_bias,
                layer.ff_out_weight,
                layer.ff_out_bias,
                *attention[layer.reach],
                cos,
                sin,
                heads=weights.heads,
                block_size=weights.block_size,
            )
        scale, shift = modulation.out[number].unbind(0)
        normed = F.layer_norm(hidden, (hidden.shape[-1],), eps=NORM_EPS) * (1 + scale) + shift
        return guided(weights.proj_out(normed).float(), guidance_scale, use_cfg)

    return velocity
