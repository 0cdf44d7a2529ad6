"""Qwen3-Omni (``model_type`` ``qwen3_omni_moe``) as a model family: an MoE thinker with the AuT audio encoder and a
vision encoder with deepstack features, an MoE talker whose code predictor fills 15 residual codebooks per 80 ms
frame, and a causal code2wav decoder (:mod:`pipeline.models.family` says what a family provides)."""
