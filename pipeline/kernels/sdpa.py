"""Which scaled-dot-product attention kernels masked prefills use."""

from torch.nn.attention import SDPBackend

PREFILL_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""Attention kernels for prefill and for the audio encoder (masked, every chunk or utterance tail a new shape). Not
cuDNN: it builds an execution plan for each new shape, which made prefills of fresh utterances take about a second
and each commit's tail encode several times longer on the GPU."""
