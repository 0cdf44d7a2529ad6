"""Thinker runner: the multimodal LLM that reads the conversation and writes the reply text.

It exposes the three operations the engine core schedules — encode user audio, prefill a span of
the conversation into a KV cache, decode one token — and returns for every position what the talker
needs: the input embedding and the last hidden state (after the final norm).

Positions: a position's KV cache index (where it is stored, what attention is causal in) and its TMRoPE rope
positions (time, height, width) differ once a conversation holds a picture: picture tokens take explicit 3-D
positions and the text after them continues at the picture's largest position + 1
(:mod:`pipeline.models.positions`). A prefill span takes its rope positions explicitly as a (3, T) host
tensor (None: the cache indices, on every axis); a decode row takes a rope *shift* (rope position - cache index, the
same on every axis: decoded tokens are text), 0 for a conversation without pictures
(:class:`~pipeline.runners.decoder.PooledDecoder`). All methods run under ``torch.inference_mode`` and must be called
from the engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from pipeline.kernels.cuda_graphs import host_to_device
from pipeline.kernels.decode_attention import triton_available
from pipeline.models.family import ThinkerParts
from pipeline.runners.decode_graphs import BatchedDecode, HostRow, graphed_prefill, prefill_graphs
from pipeline.runners.decoder import HostRope, PooledDecoder
from pipeline.runners.sampling import DeviceSampleRows, SampleRows, SamplerSpec, sample_host_rows, sample_inputs


class PrefillSpan(NamedTuple):
    """One span of a batched prefill (:meth:`ThinkerRunner.prefill_many`)."""

    embeds: torch.Tensor
    """(T, H) inputs of layer 0."""
    slot: int
    start: int
    """Cache index of the first position."""
    logits: bool
    """Whether the last position's logits are wanted."""
    rope: HostRope | None = None
    """(3, T) int64 rope positions on the host (a tensor or numpy array); None: the cache indices."""
    deepstack: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None
    """Per layer ``k`` of the first ``len(deepstack)``: (rows (n,) int64, features (n, H)) on the device, added to
    layer ``k``'s output at those rows of the span (:meth:`~pipeline.runners.decoder.PooledDecoder.prefill`)."""


@dataclass(frozen=True)
class EncodedVision:
    """A vision item's encoding in the thinker's dtype: ``tokens`` (n, H) and its deepstack features (one (n, H)
    tensor per decoder layer they are added to; empty for a tower without them)."""

    tokens: torch.Tensor
    deepstack: tuple[torch.Tensor, ...] = ()


@dataclass
class ThinkerOutput:
    """Per-position outputs of one forward pass over T positions."""

    embeds: torch.Tensor
    """(T, H) inputs of layer 0 (token embeddings, audio features at audio positions)."""
    hidden: torch.Tensor
    """(T, H) last hidden states after the final norm."""
    last_logits: torch.Tensor | None
    """(V,) float32 logits of the last position (None when not asked for)."""
    layer_hidden: torch.Tensor | None = None
    """(T, H) hidden states of the layer the talker connector reads (``ThinkerParts.talker_hidden_layer``); None when
    it reads the last."""

    @property
    def talker_hidden(self) -> torch.Tensor:
        """The hidden states the talker connector takes."""
        return self.hidden if self.layer_hidden is None else self.layer_hidden


@dataclass
class ThinkerStep:
    """Outputs of one batched decode step over B rows (views of static buffers on CUDA: consume them before the
    next step)."""

    embeds: torch.Tensor
    """(B, H) input embeddings of the fed tokens."""
    hidden: torch.Tensor
    """(B, H) last hidden states after the final norm."""
    logits: torch.Tensor
    """(B, V) float32 logits."""
    tokens: torch.Tensor | None = None
    """(B,) int64 ids sampled on the device by the runner's sampler (None without one)."""


class ThinkerRunner:
    def __init__(
        self,
        parts: ThinkerParts,
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
        """``parts``: the model family's decoder stack, vocabulary head and user-audio encoder
        (:meth:`ModelFamily.thinker_parts <pipeline.models.family.ModelFamily.thinker_parts>`; :meth:`of` asks a family
        for them). ``sampler``: how decode steps sample the next token (inside the step, so inside its CUDA graph);
        without it a step only returns logits."""
        self.text_model = parts.text_model
        self.lm_head = parts.lm_head
        self.device = torch.device(device)
        self.dtype = dtype
        self.audio = parts.audio
        """User audio blocks, batched (the family's encoder; on CUDA replayed from graphs)."""
        self.vision = parts.vision
        """The vision tower (None: the checkpoint has none)."""
        self.talker_hidden_layer = parts.talker_hidden_layer
        """The hidden state prefills also return for the talker connector (None: the last)."""
        self.decoder = PooledDecoder(
            self.text_model,
            slots=kv_slots,
            max_len=max_len,
            dtype=dtype,
            device=self.device,
            fuse=fused_decode and triton_available(self.device),
        )
        self.pool = self.decoder.pool
        self.sampler = (
            None
            if sampler is None
            else sampler.build(vocab=self.lm_head.out_features, rows=self.pool.scratch_slot + 1, device=self.device)
        )
        # a prefill that must also return an inner layer's hidden states runs eagerly (the graphs return the last only)
        self.prefills = prefill_graphs(
            self.decoder,
            width=self.text_model.config.hidden_size,
            dtype=dtype,
            cuda_graphs=cuda_graphs and self.talker_hidden_layer is None,
        )
        """Prefill spans of up to 512 positions as captured row steps (see :func:`graphed_prefill`)."""
        self.batched = BatchedDecode(
            self._decode_fn,
            pool=self.pool,
            device=self.device,
            cuda_graphs=cuda_graphs,
            batch_sizes=graph_batch_sizes,
            host_rows=(
                HostRow(),  # token ids
                HostRow(width=3),  # rope positions
                *(sample_host_rows(self.pool.scratch_slot) if self.sampler else ()),
            ),
        )

    @classmethod
    def of(cls, family, ckpt, **kwargs) -> ThinkerRunner:
        """The runner of ``ckpt``'s thinker, its parts from ``family`` (keyword arguments as for the constructor)."""
        device, cuda_graphs = torch.device(kwargs["device"]), kwargs.get("cuda_graphs", True)
        return cls(family.thinker_parts(ckpt, device=device, cuda_graphs=cuda_graphs), **kwargs)

    def capture(self) -> None:
        """Record the decode, prefill and audio-encode graphs (CUDA; seconds for a 7B model): call once at start."""
        self.batched.capture()
        self.prefills.capture()
        self.audio.capture()

    @torch.inference_mode()
    def embed(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """(T,) ids -> (T, H) input embeddings. Host ids are queued to the device without waiting for its work: a
        reply's talker prefill embeds the speaker's bos right behind the thinker's decode step, and waiting there
        left the GPU idle while the host prepared the talker's prefill."""
        if isinstance(token_ids, torch.Tensor) and token_ids.device == self.device:
            ids = token_ids.long()
        else:
            ids = host_to_device(token_ids, torch.long, self.device)
        return self.text_model.embed_tokens(ids)

    @torch.inference_mode()
    def encode_features(self, features: torch.Tensor) -> torch.Tensor:
        """Encode log-mel features (n_mels, T) of one audio block (T <= 200 frames: the encoder
        attends within 2 s blocks, so blocks encode independently): (ceil-ish T/4, H) tokens."""
        return self.encode_many([features])[0]

    def audio_tokens(self, frames: int) -> int:
        """Tokens the audio encoder makes of ``frames`` mel frames (one block or tail)."""
        return self.audio.audio_tokens(frames)

    def encode_many(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """:meth:`encode_features` of several blocks (each at most 200 frames) in one batched encode: the encoder
        attends within each block, so the blocks of different conversations batch without mixing."""
        return [out.to(self.dtype) for out in self.audio.encode_many(features)]

    def image_tokens(self, grid_thw) -> int:
        """Thinker positions the vision tower makes of a picture of patch grid ``grid_thw``."""
        return self.vision.tokens(grid_thw)

    @property
    def image_deepstack_layers(self) -> int:
        """Decoder layers a picture's features are added to past its input embeddings (0: none)."""
        return self.vision.deepstack_layers

    def encode_images(self, items: list) -> list[EncodedVision]:
        """Pictures ``(pixel_values, grid_thw)`` through the vision tower (several items may run as one batch; each
        attends within itself): each one's (tokens, H) embeddings and deepstack features, in the thinker's dtype."""
        outputs = []
        for out in self.vision.encode_many(items):
            if isinstance(out, torch.Tensor):
                outputs.append(EncodedVision(out.to(self.dtype)))
            else:
                deepstack = tuple(feature.to(self.dtype) for feature in out.deepstack)
                outputs.append(EncodedVision(out.tokens.to(self.dtype), deepstack))
        return outputs

    @torch.inference_mode()
    def prefill(
        self, embeds: torch.Tensor, slot: int, start: int, *, logits: bool = True, rope: HostRope | None = None
    ) -> ThinkerOutput:
        """Run ``embeds`` (T, H) at cache indices ``start..start+T-1`` of KV slot ``slot`` with rope positions
        ``rope`` ((3, T) int64 on the host, a tensor or numpy array; None: the cache indices); ``logits=False`` skips
        the vocabulary projection (a background prefill samples nothing)."""
        return self.prefill_many([PrefillSpan(embeds, slot, start, logits, rope)])[0]

    @property
    def prefill_rows(self) -> int | None:
        """Positions one batched prefill replays from a graph (:meth:`prefill_many`); None without prefill graphs."""
        return max(self.prefills.captured) if self.prefills.captured else None

    @torch.inference_mode()
    def prefill_many(self, spans: Sequence[PrefillSpan | tuple]) -> list[ThinkerOutput]:
        """Several :meth:`prefill` calls, a :class:`PrefillSpan` (or its fields as a tuple) each, in one replay when
        their positions together fit the largest prefill graph (one row per position; each span's rows attend within
        their own slot), else one by one: spans with deepstack features, or when the talker reads an inner layer's
        hidden states, always run eagerly. Spans must be in different slots (or not overlap)."""
        parsed = [PrefillSpan(*span) for span in spans]
        sizes = [span.embeds.shape[0] for span in parsed]
        for span in parsed:
            self._check_rope(span.rope, span.embeds.shape[0])
        eager = self.talker_hidden_layer is not None or any(span.deepstack for span in parsed)
        if eager or not self.prefills.fits(sum(sizes)):
            return [self._prefill_eager(*span) for span in parsed]
        hiddens = graphed_prefill(self.prefills, [(slot, x, start, rope) for x, slot, start, _, rope, _ in parsed])
        wanted = [i for i, span in enumerate(parsed) if span.logits]
        last: dict[int, torch.Tensor] = {}
        if wanted:
            logits = self.lm_head(torch.stack([hiddens[i][-1] for i in wanted])).float()
            last = {i: logits[k] for k, i in enumerate(wanted)}
        return [
            ThinkerOutput(embeds=span.embeds, hidden=h, last_logits=last.get(i))
            for i, (span, h) in enumerate(zip(parsed, hiddens))
        ]

    def _check_rope(self, rope: HostRope | None, rows: int) -> None:
        """Rope positions must be (3, rows) and inside the decoder's cos/sin table (checked on the host)."""
        self.decoder.check_host_rope(rope, rows)

    def _prefill_eager(
        self,
        embeds: torch.Tensor,
        slot: int,
        start: int,
        logits: bool,
        rope: HostRope | None,
        deepstack: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> ThinkerOutput:
        device_rope = None if rope is None else torch.as_tensor(rope).to(self.device, torch.long)
        layer_hidden = None
        deepstack = deepstack or None
        if self.talker_hidden_layer is None:
            hidden = self.decoder.prefill(slot, embeds, start, device_rope, deepstack=deepstack)
        else:
            layer = self.talker_hidden_layer
            hidden, layer_hidden = self.decoder.prefill(
                slot, embeds, start, device_rope, deepstack=deepstack, capture_layer=layer
            )
        last = self.lm_head(hidden[-1:]).float()[0] if logits else None
        return ThinkerOutput(embeds=embeds, hidden=hidden, last_logits=last, layer_hidden=layer_hidden)

    @torch.inference_mode()
    def decode(
        self,
        tokens: list[int],
        slots: list[int],
        positions: list[int],
        sample: SampleRows | None = None,
        rope_shifts: list[int] | None = None,
    ) -> ThinkerStep:
        """One token per row: row b feeds ``tokens[b]`` at cache index ``positions[b]`` of slot ``slots[b]``, at rope
        position ``positions[b] + rope_shifts[b]`` on every axis (None: shifts 0) (all rows in one batch; one CUDA
        graph replay on a GPU), and, with a sampler, samples the next token of each row with ``sample``'s rows.
        Nothing here waits for the device: read ``tokens`` (one transfer) when needed."""
        sampling = sample_inputs(len(tokens), self.pool.scratch_slot, self.sampler, sample)
        rope = positions
        if rope_shifts is not None:
            rope = [p + d for p, d in zip(positions, rope_shifts)]
            if any(not 0 <= p < self.decoder.rope_len for p in rope):
                raise ValueError(f"rope positions must lie in [0, {self.decoder.rope_len})")
        outputs = self.batched(slots, positions, (tokens, (rope, rope, rope), *sampling))
        embeds, hidden, logits = outputs[:3]
        return ThinkerStep(embeds=embeds, hidden=hidden, logits=logits, tokens=outputs[3] if self.sampler else None)

    def _decode_fn(
        self,
        slots: torch.Tensor,
        positions: torch.Tensor,
        ids: torch.Tensor,
        rope: torch.Tensor,
        *sample: torch.Tensor,
        graph_safe: bool,
    ):
        embeds = self.text_model.embed_tokens(ids)
        hidden = self.decoder.decode(embeds, slots, positions, rope, graph_safe=graph_safe)
        logits = self.lm_head(hidden).float()
        if self.sampler is None:
            return embeds, hidden, logits
        return embeds, hidden, logits, self.sampler.sample_device(logits, DeviceSampleRows(*sample))
