"""Talker runner: turns the thinker's reply, vector by vector, into codec tokens (50 per second).

Streaming contract (the reference ``generate`` computes the same thing after the fact):
- prefill = [prompt talker vectors] + [embed(speaker bos)] + [vector of reply token 0], where the
  last two positions also get the codec embeddings of ``codec_pad`` and ``codec_bos``; its logits
  give the first codec token.
- decode step k consumes the next queued thinker vector (reply token k, then text-eos, then
  text-pad forever) plus the embedding of the previous codec token.
So the talker can start as soon as the thinker has run reply token 0 through its layers, and then
needs the thinker one token ahead — it never waits for the whole reply.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class TalkerRunner:
    def __init__(self, talker, *, device: torch.device, dtype: torch.dtype) -> None:
        self.model = talker
        self.proj = talker.thinker_to_talker_proj
        self.body = talker.model
        self.head = talker.codec_head
        self.codec_embed = talker.model.embed_tokens
        self.device = torch.device(device)
        self.dtype = dtype
        self.config = talker.config

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @torch.inference_mode()
    def prefill(
        self, vectors: torch.Tensor, *, codec_pad: int, codec_bos: int, cache: DynamicCache, start: int = 0
    ) -> torch.Tensor:
        """``vectors`` (P, H_thinker) — the prompt positions from ``start`` on (earlier ones are
        already in ``cache``), then [speaker bos, reply token 0]; returns (V,) logits."""
        x = vectors.to(self.device, self.dtype).clone()
        special = self.codec_embed(torch.tensor([codec_pad, codec_bos], device=self.device))
        x[-2:] = x[-2:] + special
        return self._run(x, cache, start=start)

    @torch.inference_mode()
    def decode(self, prev_code: int, vector: torch.Tensor, *, cache: DynamicCache) -> torch.Tensor:
        """One step: previous codec token + the next thinker vector (H_thinker,); returns (V,) logits."""
        code = self.codec_embed(torch.tensor([prev_code], device=self.device))
        x = code + vector.to(self.device, self.dtype).view(1, -1)
        return self._run(x, cache, start=cache.get_seq_length())

    def _run(self, x: torch.Tensor, cache: DynamicCache, start: int) -> torch.Tensor:
        t = x.shape[0]
        positions = torch.arange(start, start + t, device=self.device).view(1, 1, -1).expand(3, 1, -1)
        out = self.body(
            inputs_embeds=self.proj(x).unsqueeze(0), position_ids=positions, past_key_values=cache, use_cache=True
        )
        return self.head(out.last_hidden_state[0, -1:]).float()[0]
