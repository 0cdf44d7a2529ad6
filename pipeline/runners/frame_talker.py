"""Frame talker runner: a talker that makes one frame of several codebooks per step (see
:mod:`pipeline.models.frame_talker` for the streaming contract the family's parts follow).

A frame is one fixed-shape function of its rows (:meth:`FrameTalkerRunner._step`): the talker's decoder for every row
at once (pooled KV cache, every row at its own position), codebook 0 sampled by the stage's sampler (suppressed ids,
stop ids, repetition penalty, per-response seeds), then the family's residual predictor over a KV pool of its own
(:class:`~pipeline.runners.residual_predictor.PooledResidualPredictor`, row b in predictor slot b) with its codebooks
sampled by the residual sampler. Nothing in it reads the device back, so on CUDA it is captured once per batch size
(:class:`~pipeline.runners.decode_graphs.BatchedDecode`, at engine start: :meth:`FrameTalkerRunner.capture`) and a
frame of B rows costs one replay of the smallest captured size >= B; elsewhere (or with ``cuda_graphs`` off) the same
function runs eagerly. Chains of frames (:meth:`FrameTalkerRunner.decode_chain`) feed each frame back on the device.

A reply's start (:meth:`FrameTalkerRunner.start`) is captured too: its prefill (and a background
:meth:`FrameTalkerRunner.prefill_prompt`) runs as rows of one captured step when its positions fit the largest prefill
graph (:func:`~pipeline.runners.decode_graphs.graphed_prefill`; eagerly otherwise, or without graphs), and its first
frame is one more captured function of one row (the prefill's last hidden state -> the frame: the same frame code as
a decode step's, its residual in the predictor's scratch slot, so a batched frame may be in flight beside it). Neither
reads the device back, so the host queues a whole start without waiting.

Sampling noise: codebook 0 draws with the row's seed and counter (its frames so far); residual codebook ``k`` (1 ..
groups - 1) with the same seed and counter ``counter * groups + k - 1``, so no two draws of a reply share noise.

Positions: a position's rope position is its cache index on every axis unless the call gives others: a prefill's
explicit (3, P) rope positions (a prompt with pictures), a decode row's rope shift (rope position - cache index).

Devices: the talker may be on another GPU than the thinker; its inputs are copied to its device inside each call,
which runs with that device current.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.kernels.cuda_graphs import host_to_device
from pipeline.kernels.devices import device_scope
from pipeline.models.frame_talker import FrameTalkerParts
from pipeline.runners.decode_graphs import (
    BatchedDecode,
    HostRow,
    HostValues,
    default_batch_sizes,
    graphed_prefill,
    prefill_graphs,
    shifted_rope_rows,
)
from pipeline.runners.decoder import HostRope, PooledDecoder
from pipeline.runners.residual_predictor import PooledResidualPredictor
from pipeline.runners.sampling import DeviceSampleRows, SampleRows, SamplerSpec, sample_host_rows

__all__ = ["FrameTalkerRunner"]

_POSITION_ROW = 1
"""Rows of a frame step's packed host inputs (:class:`BatchedDecode`): slots, positions, then the host rows in the
order :class:`FrameTalkerRunner` declares them: the rope positions (three rows), the previous frame (``groups`` rows),
then the sampler's (table row, stop suppression, seed, counter; :func:`sample_host_rows`)."""
_ROPE_ROWS = slice(2, 5)
_FRAME_START = 5


class FrameTalkerRunner:
    def __init__(
        self,
        parts: FrameTalkerParts,
        *,
        device: torch.device,
        dtype: torch.dtype,
        kv_slots: int,
        max_len: int,
        sampler: SamplerSpec,
        residual_sampler: SamplerSpec,
        cuda_graphs: bool = True,
        graph_batch_sizes: tuple[int, ...] = (),
    ) -> None:
        """``sampler``: how codebook 0 is sampled (its stop ids end an utterance); ``residual_sampler``: how the
        residual predictor's codebooks are. ``graph_batch_sizes``: the frame batch sizes captured (default
        :func:`default_batch_sizes` of ``kv_slots``)."""
        self.parts = parts
        self.groups = parts.groups
        self.device = torch.device(device)
        self.dtype = dtype
        self.decoder = PooledDecoder(parts.body, slots=kv_slots, max_len=max_len, dtype=dtype, device=self.device)
        self.pool = self.decoder.pool
        self.sampler = sampler.build(vocab=parts.head.out_features, rows=self.pool.scratch_slot + 1, device=self.device)
        self.residual_sampler = residual_sampler.build(
            vocab=parts.residual.vocab, rows=self.pool.scratch_slot + 1, device=self.device
        )
        batch_sizes = tuple(sorted(graph_batch_sizes)) or default_batch_sizes(kv_slots)
        self.predictor = PooledResidualPredictor(
            parts.residual, groups=self.groups, rows=max(kv_slots, *batch_sizes), dtype=dtype, device=self.device
        )
        self.batched = BatchedDecode(
            self._step,
            pool=self.pool,
            device=self.device,
            cuda_graphs=cuda_graphs,
            batch_sizes=batch_sizes,
            host_rows=(
                HostRow(width=3),  # rope positions
                HostRow(width=self.groups),  # the previous frame
                *sample_host_rows(self.pool.scratch_slot),
            ),
            device_rows=lambda b: (torch.zeros(b, parts.text_width, dtype=dtype, device=self.device),),
        )
        self._counter_row = _FRAME_START + self.groups + 3
        width = parts.body.config.hidden_size
        self.prefills = prefill_graphs(self.decoder, width=width, dtype=dtype, cuda_graphs=cuda_graphs)
        """Prefills of up to 512 positions as captured row steps (see :func:`graphed_prefill`)."""
        self.first_frame = BatchedDecode(
            self._first_frame,
            pool=self.pool,
            device=self.device,
            cuda_graphs=cuda_graphs,
            batch_sizes=(1,),
            host_rows=sample_host_rows(self.pool.scratch_slot),
            device_rows=lambda b: (torch.zeros(b, width, dtype=dtype, device=self.device),),
        )
        """A reply's first frame from its prefill's last hidden state (one row: :meth:`_first_frame`)."""

    @property
    def can_chain(self) -> bool:
        """Chains of frames fed on the device (:meth:`decode_chain`) are always offered."""
        return True

    def capture(self) -> None:
        """Record the frame step's, the prefill's and the first frame's graphs (CUDA with Triton only): call once at
        start."""
        with device_scope(self.device):
            self.batched.capture()
            # one stream, so one cuBLAS workspace: these graphs replay one after the other, on the engine thread
            self.prefills.capture_stream = self.first_frame.capture_stream = self.batched.capture_stream
            self.prefills.capture()
            self.first_frame.capture()

    @torch.inference_mode()
    def prefill_prompt(
        self, inputs: torch.Tensor, *, slot: int, start: int, rope: HostRope | None = None
    ) -> torch.Tensor:
        """Talker inputs (P, Ht) at cache indices ``start .. start+P-1`` of ``slot``, at rope positions ``rope``
        ((3, P) int64 on the host, a numpy array or tensor; None: the cache indices); returns the last position's
        hidden state (Ht,). One replay of a prefill graph when P fits the largest, else eager; nothing here waits for
        the device."""
        self.decoder.check_host_rope(rope, inputs.shape[0])
        with device_scope(self.device):
            x = inputs.to(self.device, self.dtype)
            if self.prefills.fits(x.shape[0]):
                (hidden,) = graphed_prefill(self.prefills, [(slot, x, start, rope)])
            else:
                positions = None if rope is None else host_to_device(torch.as_tensor(rope), torch.long, self.device)
                hidden = self.decoder.prefill(slot, x, start, positions)
            return hidden[-1]

    @torch.inference_mode()
    def start(
        self, inputs: torch.Tensor, *, slot: int, start: int, sample: SampleRows, rope: HostRope | None = None
    ) -> torch.Tensor:
        """A reply's prefill (the prompt positions past ``start``, then its opening: talker inputs (P, Ht), at rope
        positions ``rope`` as for :meth:`prefill_prompt`) and its first frame, (groups,) int64 on the device (a copy).
        The frame is the decode steps' own code (:meth:`_frame`), its residual in the predictor's scratch slot (a
        batched frame may be in flight beside it), one replay of the first frame's graph on CUDA. Nothing here waits
        for the device."""
        hidden = self.prefill_prompt(inputs, slot=slot, start=start, rope=rope)
        last = start + inputs.shape[0] - 1
        with device_scope(self.device):
            (frame,) = self.first_frame([slot], [last], sample.columns(), hidden.unsqueeze(0))
            return frame[0].clone()  # a replay's output is the graph's buffer: the next replay overwrites it

    @torch.inference_mode()
    def decode(
        self,
        frames: Sequence[Sequence[int]],
        text: torch.Tensor,
        slots: list[int],
        positions: list[int],
        sample: SampleRows,
        rope_shifts: list[int] | None = None,
    ) -> torch.Tensor:
        """One frame per row: the previous frames (B lists of ``groups`` codes) and the next text vectors (B, H), row b
        at cache index ``positions[b]`` of ``slots[b]`` and rope position ``positions[b] + rope_shifts[b]`` on every
        axis (None: shifts 0). Returns the new frames (B, groups) int64 on the device, a copy (codebook 0 a stop id:
        the utterance ended; the rest of that frame means nothing). Nothing here waits for the device."""
        host = self._host_rows(frames, positions, sample, rope_shifts)
        with device_scope(self.device):
            (out,) = self.batched(slots, positions, host, text.to(self.device, self.dtype))
            return out.clone()  # a replay's output is the graph's buffer: the next replay overwrites it

    @torch.inference_mode()
    def decode_chain(
        self,
        frames: Sequence[Sequence[int]],
        text: torch.Tensor,
        slots: list[int],
        positions: list[int],
        sample: SampleRows,
        steps: int,
        rope_shifts: list[int] | None = None,
    ) -> torch.Tensor:
        """``steps`` frames in a row for every row, each step fed the frame the step before made and the same text
        vectors (B, H): what a reply past its text gets (the text-pad vector at every step). The later steps' inputs are
        made on the device (positions, rope positions and sample counters + 1, the frame as the next input), so the host
        queues the chain at once and reads it once. The frames equal ``steps`` calls of :meth:`decode` fed back that
        way (the same ``rope_shifts``), with ``sample``'s stop suppression held for every step. Returns (steps, B,
        groups) int64 on the device (a copy). A row's frames after one whose codebook 0 is a stop id mean nothing."""
        frame_rows = slice(_FRAME_START, _FRAME_START + self.groups)

        def advance(packed: torch.Tensor, outputs: tuple[torch.Tensor, ...], rows: int) -> None:
            packed[_POSITION_ROW, :rows] += 1
            packed[_ROPE_ROWS, :rows] += 1
            packed[frame_rows, :rows] = outputs[0].T
            packed[self._counter_row, :rows] += 1

        host = self._host_rows(frames, positions, sample, rope_shifts)
        with device_scope(self.device):
            text = text.to(self.device, self.dtype)
            return self.batched.chain(slots, positions, host, text, steps=steps, advance=advance, keep=0)

    def _host_rows(
        self,
        frames: Sequence[Sequence[int]],
        positions: list[int],
        sample: SampleRows,
        rope_shifts: list[int] | None,
    ) -> tuple[HostValues, ...]:
        """A step's host row inputs, in the order the step declares them; ValueError for a batch the predictor's pool
        cannot hold or frames of the wrong width."""
        if len(frames) > self.predictor.rows:
            raise ValueError(f"a frame batch holds at most {self.predictor.rows} rows, got {len(frames)}")
        if any(len(frame) != self.groups for frame in frames):
            raise ValueError(f"every previous frame must have {self.groups} codes")
        by_codebook = [[frame[j] for frame in frames] for j in range(self.groups)]
        rope = shifted_rope_rows(positions, rope_shifts, self.decoder.rope_len)
        return (rope, by_codebook, *sample.columns())

    def _step(self, slots, positions, rope, *rest: torch.Tensor, graph_safe: bool) -> tuple[torch.Tensor]:
        """The frame of B rows :class:`BatchedDecode` runs or captures: (B, groups) int64. Rows ``rest``: the previous
        frames (groups, B), the sampler's four rows, then the text vectors (B, H)."""
        frames, *sample, text = rest
        x = self.parts.step_inputs(frames.T, text)
        hidden = self.decoder.decode(x.to(self.dtype), slots, positions, rope, graph_safe=graph_safe)
        predictor_slots = torch.arange(hidden.shape[0], device=self.device)
        return (self._frame(hidden, DeviceSampleRows(*sample), predictor_slots, graph_safe=graph_safe),)

    def _first_frame(self, slots, positions, *rest: torch.Tensor, graph_safe: bool) -> tuple[torch.Tensor]:
        """A reply's first frame, the function :attr:`first_frame` runs or captures (one row): (1, groups) int64 from
        the prefill's last hidden state (1, Ht) (``rest``: the sampler's four rows, then the hidden state), its
        residual in the predictor's scratch slot. ``slots``/``positions`` (the reply's slot, its last prefill
        position) are not read: the frame's cache work is the predictor's."""
        *sample, hidden = rest
        scratch = torch.full_like(slots, self.predictor.scratch_slot)
        return (self._frame(hidden, DeviceSampleRows(*sample), scratch, graph_safe=graph_safe),)

    def _frame(
        self, hidden: torch.Tensor, rows: DeviceSampleRows, predictor_slots: torch.Tensor, *, graph_safe: bool
    ) -> torch.Tensor:
        """Codebook 0 sampled from ``hidden``'s (B, Ht) logits, then the residual codebooks, row b's in predictor slot
        ``predictor_slots[b]``; (B, groups) int64 on the device, no host synchronisation."""
        codes = self.sampler.sample_device(self.parts.head(hidden).float(), rows)
        neutral = torch.full_like(rows.rows, self.pool.scratch_slot)  # no repetition state for residual codebooks
        unforced = torch.zeros_like(rows.force_continue)

        def pick(residual_logits: torch.Tensor, step: int) -> torch.Tensor:
            # distinct noise per codebook: counter * groups + step never repeats across frames or codebooks
            residual_rows = DeviceSampleRows(neutral, unforced, rows.seeds, rows.counters * self.groups + step)
            return self.residual_sampler.sample_device(residual_logits, residual_rows)

        rest = self.predictor.predict(hidden, codes, pick, slots=predictor_slots, graph_safe=graph_safe)
        return torch.cat([codes.view(-1, 1), rest], dim=1)
