"""Talker runner: turns the thinker's reply, vector by vector, into codec tokens (50 per second).

Streaming contract (the reference ``generate`` computes the same thing after the fact):
- prefill = [prompt talker vectors] + [embed(speaker bos)] + [vector of reply token 0], where the
  last two positions also get the codec embeddings of ``codec_pad`` and ``codec_bos``; its logits
  give the first codec token.
- decode step k consumes the next queued thinker vector (reply token k, then text-eos, then
  text-pad forever) plus the embedding of the previous codec token.
So the talker can start as soon as the thinker has run reply token 0 through its layers, and then
needs the thinker one token ahead — it never waits for the whole reply.

Positions: as in the reference, the talker's prompt positions take the thinker's TMRoPE positions of the same
positions (3-D for pictures and video) and every later position (speaker bos, reply vectors, codes) its cache index
plus a rope shift, the thinker's after the prompt: a prefill takes its rope positions as a (3, T) host array (None:
the cache indices), a decode row a shift (0 without pictures or video); see
:class:`~pipeline.runners.decoder.PooledDecoder`.

Devices: the talker may be on another GPU than the thinker. Its inputs (the thinker's vectors, on the thinker's
device) are copied to the talker's device inside each call, device to device, and every call runs with the talker's
device current (:func:`~pipeline.kernels.devices.device_scope`: its Triton kernels launch on the current device).
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.kernels.cuda_graphs import host_to_device
from pipeline.kernels.decode_attention import triton_available
from pipeline.kernels.devices import device_scope
from pipeline.runners.decode_graphs import (
    BatchedDecode,
    HostRow,
    HostValues,
    graphed_prefill,
    prefill_graphs,
    shifted_rope_rows,
)
from pipeline.runners.decoder import PooledDecoder
from pipeline.runners.sampling import DeviceSampleRows, SampleRows, SamplerSpec, sample_host_rows, sample_inputs

_POSITION_ROW = 1
"""Rows of a decode step's packed host inputs (:class:`BatchedDecode`): slots, positions, then the host rows in the
order :class:`TalkerRunner` declares them: the previous code, the rope positions (three rows), then the sampler's
(table row, stop suppression, seed, counter; :func:`sample_host_rows`)."""
_CODE_ROW = 2
_ROPE_ROWS = slice(3, 6)
_COUNTER_ROW = 9


class TalkerRunner:
    def __init__(
        self,
        talker,
        *,
        device: torch.device,
        dtype: torch.dtype,
        kv_slots: int,
        max_len: int,
        cuda_graphs: bool = True,
        graph_batch_sizes: tuple[int, ...] = (),
        fused_decode: bool = True,
        sampler: SamplerSpec | None = None,
    ) -> None:
        """``sampler``: how decode steps sample the next codec token (inside the step's CUDA graph)."""
        self.model = talker
        self.proj = talker.thinker_to_talker_proj
        self.body = talker.model
        self.head = talker.codec_head
        self.codec_embed = talker.model.embed_tokens
        self.device = torch.device(device)
        self.dtype = dtype
        self.config = talker.config
        self.decoder = PooledDecoder(
            self.body,
            slots=kv_slots,
            max_len=max_len,
            dtype=dtype,
            device=self.device,
            fuse=fused_decode and triton_available(self.device),
        )
        self.pool = self.decoder.pool
        width = self.proj.in_features
        self.sampler = (
            None
            if sampler is None
            else sampler.build(vocab=self.head.out_features, rows=self.pool.scratch_slot + 1, device=self.device)
        )
        self.prefills = prefill_graphs(
            self.decoder, width=self.body.config.hidden_size, dtype=dtype, cuda_graphs=cuda_graphs
        )
        """Prefill spans of up to 512 positions as captured row steps (see :func:`graphed_prefill`)."""
        self.batched = BatchedDecode(
            self._decode_fn,
            pool=self.pool,
            device=self.device,
            cuda_graphs=cuda_graphs,
            batch_sizes=graph_batch_sizes,
            host_rows=(
                HostRow(),  # the previous code
                HostRow(width=3),  # rope positions
                *(sample_host_rows(self.pool.scratch_slot) if self.sampler else ()),
            ),
            device_rows=lambda b: (torch.zeros(b, width, dtype=dtype, device=self.device),),
        )

    def capture(self) -> None:
        """Record the decode and prefill graphs (CUDA with Triton only): call once at start."""
        with device_scope(self.device):
            self.batched.capture()
            self.prefills.capture()

    @torch.inference_mode()
    def prefill(
        self,
        vectors: torch.Tensor,
        *,
        codec_pad: int,
        codec_bos: int,
        slot: int,
        start: int = 0,
        rope: np.ndarray | None = None,
    ) -> torch.Tensor:
        """``vectors`` (P, H_thinker) — the prompt positions from ``start`` on (earlier ones are
        already in the slot), then [speaker bos, reply token 0] — at rope positions ``rope`` ((3, P) int64 on the host;
        None: the cache indices); returns (V,) logits."""
        self.decoder.check_host_rope(rope, vectors.shape[0])
        with device_scope(self.device):
            x = vectors.to(self.device, self.dtype).clone()
            special = self.codec_embed(host_to_device([codec_pad, codec_bos], torch.long, self.device))
            x[-2:] = x[-2:] + special
            hidden = self._prefill_rows(self.proj(x), slot, start, rope)
            return self.head(hidden[-1:]).float()[0]

    @torch.inference_mode()
    def prefill_prompt(self, vectors: torch.Tensor, *, slot: int, start: int, rope: np.ndarray | None = None) -> None:
        """``vectors`` (P, H_thinker): prompt positions ``start .. start+P-1`` only, at rope positions ``rope`` (as
        for :meth:`prefill`), no logits: the talker's cache brought up to the conversation ahead of a reply, so that
        :meth:`prefill` later gets only the rest."""
        self.decoder.check_host_rope(rope, vectors.shape[0])
        with device_scope(self.device):
            self._prefill_rows(self.proj(vectors.to(self.device, self.dtype)), slot, start, rope)

    def _prefill_rows(self, x: torch.Tensor, slot: int, start: int, rope: np.ndarray | None) -> torch.Tensor:
        if self.prefills.fits(x.shape[0]):
            (hidden,) = graphed_prefill(self.prefills, [(slot, x, start, rope)])
            return hidden
        device_rope = None if rope is None else torch.as_tensor(rope).to(self.device, torch.long)
        return self.decoder.prefill(slot, x, start, device_rope)

    @torch.inference_mode()
    def decode(
        self,
        prev_codes: list[int],
        vectors: torch.Tensor,
        slots: list[int],
        positions: list[int],
        sample: SampleRows | None = None,
        rope_shifts: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step per row: previous codec token + the next thinker vector (B, H_thinker), row b at cache index
        ``positions[b]`` and rope position ``positions[b] + rope_shifts[b]`` on every axis (None: shifts 0). Returns
        (B, V) float32 logits and, with a sampler, the (B,) codes sampled with ``sample``'s rows (views of static
        buffers on CUDA: consume them before the next step). Nothing here waits for the device."""
        sampling = sample_inputs(len(prev_codes), self.pool.scratch_slot, self.sampler, sample)
        rope = shifted_rope_rows(positions, rope_shifts, self.decoder.rope_len)
        host: tuple[HostValues, ...] = (prev_codes, rope, *sampling)
        with device_scope(self.device):
            outputs = self.batched(slots, positions, host, vectors.to(self.device, self.dtype))
        return outputs[0], outputs[1] if self.sampler else None

    @property
    def can_chain(self) -> bool:
        """Whether :meth:`decode_chain` can run: it needs the in-graph sampler."""
        return self.sampler is not None

    @torch.inference_mode()
    def decode_chain(
        self,
        prev_codes: list[int],
        vectors: torch.Tensor,
        slots: list[int],
        positions: list[int],
        sample: SampleRows,
        steps: int,
        rope_shifts: list[int] | None = None,
    ) -> torch.Tensor:
        """``steps`` decode steps in a row for every row, each fed the code the step before sampled and the same
        thinker vector (B, H_thinker): what a reply past its text gets (the text-pad vector at every step). The
        inputs of the later steps are made on the device (positions, rope positions and sample counters + 1, the
        sampled code as the next input), so the host queues the chain at once and waits for it once. The codes equal
        ``steps`` calls of :meth:`decode` that feed each call's code back with positions and counters one further (the
        same ``rope_shifts``), and ``sample``'s stop suppression (``force_continue``) holds for every step. Returns
        (steps, B) int64 codes on the device (a copy). A chain of a row that samples a stop code goes on past it: its
        later codes mean nothing."""
        if self.sampler is None:
            raise ValueError("chained talker steps need the in-graph sampler")

        def advance(packed: torch.Tensor, outputs: tuple[torch.Tensor, ...], rows: int) -> None:
            packed[_POSITION_ROW, :rows] += 1
            packed[_CODE_ROW, :rows] = outputs[1]
            packed[_ROPE_ROWS, :rows] += 1
            packed[_COUNTER_ROW, :rows] += 1

        sampling = sample_inputs(len(prev_codes), self.pool.scratch_slot, self.sampler, sample)
        rope = shifted_rope_rows(positions, rope_shifts, self.decoder.rope_len)
        host: tuple[HostValues, ...] = (prev_codes, rope, *sampling)
        with device_scope(self.device):
            return self.batched.chain(
                slots, positions, host, vectors.to(self.device, self.dtype), steps=steps, advance=advance, keep=1
            )

    def _decode_fn(self, slots, positions, codes, rope, *rest: torch.Tensor, graph_safe: bool):
        *sample, vectors = rest  # host rows (sampling) come before the device row (vectors)
        x = self.proj(self.codec_embed(codes) + vectors)
        hidden = self.decoder.decode(x, slots, positions, rope, graph_safe=graph_safe)
        logits = self.head(hidden).float()
        if self.sampler is None:
            return (logits,)
        return logits, self.sampler.sample_device(logits, DeviceSampleRows(*sample))
