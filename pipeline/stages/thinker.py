"""Thinker runner: the multimodal LLM that reads the conversation and writes the reply text.

It exposes the three operations the engine core schedules — encode user audio, prefill a span of
the conversation into a KV cache, decode one token — and returns for every position what the talker
needs: the input embedding and the last hidden state (after the final norm).

Positions: text and audio tokens use plain sequential positions on all three TMRoPE axes (the 3-D
positions of Qwen2.5-Omni differ from ``arange`` only for images and video), so a span prefilled at
offset ``start`` uses ``start .. start+T-1``. All methods run under ``torch.inference_mode`` and
must be called from the engine thread only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from pipeline.models.qwen2_5_omni.parts import thinker_audio_tower, thinker_text_model



@dataclass
class ThinkerOutput:
    """Per-position outputs of one forward pass over T positions."""

    embeds: torch.Tensor
    """(T, H) inputs of layer 0 (token embeddings, audio features at audio positions)."""
    hidden: torch.Tensor
    """(T, H) last hidden states after the final norm."""
    last_logits: torch.Tensor
    """(V,) float32 logits of the last position."""


class ThinkerRunner:
    def __init__(self, thinker, *, device: torch.device, dtype: torch.dtype) -> None:
        self.model = thinker
        self.text_model = thinker_text_model(thinker)
        self.audio_tower = thinker_audio_tower(thinker)
        self.lm_head = thinker.lm_head
        self.device = torch.device(device)
        self.dtype = dtype
        self.config = thinker.config

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config.text_config)

    @torch.inference_mode()
    def embed(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """(T,) ids -> (T, H) input embeddings."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device)
        return self.text_model.embed_tokens(ids)

    @torch.inference_mode()
    def encode_features(self, features: torch.Tensor) -> torch.Tensor:
        """Encode log-mel features (n_mels, T) of one audio block (T <= 200 frames: the encoder
        attends within 2 s blocks, so blocks encode independently): (ceil-ish T/4, H) tokens."""
        features = features.to(self.device, self.audio_tower.conv1.weight.dtype)
        lens = torch.tensor([features.shape[1]], dtype=torch.long, device=self.device)
        after_cnn, _ = self.audio_tower._get_feat_extract_output_lengths(lens)
        out = self.audio_tower(features, feature_lens=lens, aftercnn_lens=after_cnn)
        return out.last_hidden_state.to(self.dtype)

    @torch.inference_mode()
    def forward(self, embeds: torch.Tensor, cache: DynamicCache, start: int) -> ThinkerOutput:
        """Run ``embeds`` (T, H) at positions ``start..start+T-1``, extending ``cache``."""
        t = embeds.shape[0]
        positions = torch.arange(start, start + t, device=self.device).view(1, 1, -1).expand(3, 1, -1)
        out = self.text_model(
            inputs_embeds=embeds.unsqueeze(0).to(self.dtype),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state[0]
        logits = self.lm_head(hidden[-1:]).float()[0]
        return ThinkerOutput(embeds=embeds, hidden=hidden, last_logits=logits)
