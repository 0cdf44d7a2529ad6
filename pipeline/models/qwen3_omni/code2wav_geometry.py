"""Index arithmetic of Qwen3-Omni's code2wav ConvNet: which transformer frames each output sample depends on.

``Qwen3OmniMoeCode2Wav`` runs a causal sliding-window transformer over the code frames, then a ConvNet
(``upsample`` then ``decoder``) from the transformer's hidden frames to 24 kHz samples. The ConvNet's layers are of
two kinds, read here from the module itself (never from constants):

- causal convolutions (``Qwen3OmniMoeCausalConvNet``, stride 1): zero padding on the left only, so output step ``j``
  reads input steps ``[j - (k - 1) * dilation, j]`` and the length is kept;
- transposed convolutions (``Qwen3OmniMoeCausalTransConvNet``) with kernel ``K`` and stride ``r``, whose full output
  is trimmed by ``left_pad`` and ``right_pad``: the ``upsample`` ones (``K == r``) map ``L`` steps to ``L * r``, but
  the decoder's (``K == 2r``, trimmed ``r`` each side) map ``L`` to ``(L - 1) * r``, and their output step ``n`` reads
  input steps ``n // r`` and ``n // r + 1``: one step of look-ahead, whose samples the trim drops at the right end.

So ``T`` frames give ``samples(T) = T * samples_per_frame - deficit`` samples (the released checkpoint: 1920 per frame,
deficit 555), the window's output is aligned to its first frame (window sample ``j`` of frames ``[s, b)`` is
utterance sample ``s * samples_per_frame + j``), and every sample the ConvNet makes of frames ``[0, b)`` depends on
those frames only: the first ``samples(b)`` samples of an utterance are final once ``b`` frames are known. Looking left,
a sample of frame ``f`` reads hidden frames back to ``f - left_context_frames`` at most (the released checkpoint: 9),
through the ConvNeXt and residual kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavDecoderResidualUnit,
    Qwen3OmniMoeConvNeXtBlock,
    Qwen3OmniMoeSnakeBeta,
)

from pipeline.errors import CheckpointError

__all__ = ["ConvGeometry", "ConvLayer"]


@dataclass(frozen=True)
class ConvLayer:
    """One length-changing or neighbour-reading layer of the ConvNet, in forward order.

    ``transposed`` False: a causal convolution of effective kernel ``kernel`` (dilation included), stride 1.
    ``transposed`` True: a transposed convolution of kernel ``kernel``, stride ``stride``, its full output trimmed by
    ``left`` steps at the start and ``right`` at the end."""

    transposed: bool
    kernel: int
    stride: int = 1
    left: int = 0
    right: int = 0

    def length(self, steps: int) -> int:
        """Output steps of ``steps`` input steps."""
        if not self.transposed or steps == 0:
            return steps
        return max(0, (steps - 1) * self.stride + self.kernel - self.left - self.right)

    def inputs(self, lo: int, hi: int) -> tuple[int, int]:
        """The input steps ``[lo', hi']`` that output steps ``[lo, hi]`` read (unclipped: negative means padding)."""
        if not self.transposed:
            return lo - (self.kernel - 1), hi
        # full output step j = n + left reads input i where 0 <= j - i * stride < kernel
        return -((self.kernel - 1 - lo - self.left) // self.stride), (hi + self.left) // self.stride


def _layers(module: nn.Module) -> list[ConvLayer]:
    if isinstance(module, Qwen3OmniMoeCausalConvNet):
        if module.stride != 1:
            raise CheckpointError(f"code2wav: a causal convolution of stride {module.stride} (only 1 is supported)")
        return [ConvLayer(transposed=False, kernel=module.kernel_size)]
    if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
        conv = module.conv
        if conv.padding[0] or conv.output_padding[0] or conv.dilation[0] != 1:
            raise CheckpointError("code2wav: a transposed convolution with padding or dilation (unsupported)")
        return [ConvLayer(True, conv.kernel_size[0], conv.stride[0], module.left_pad, module.right_pad)]
    if isinstance(module, Qwen3OmniMoeConvNeXtBlock):
        return _layers(module.dwconv)  # the rest of the block is pointwise, plus the identity path
    if isinstance(module, Qwen3OmniMoeCode2WavDecoderResidualUnit):
        return _layers(module.conv1) + _layers(module.conv2)  # reads a superset of the identity path's steps
    if isinstance(module, (Qwen3OmniMoeCode2WavDecoderBlock, nn.ModuleList)):
        children = module.block if isinstance(module, Qwen3OmniMoeCode2WavDecoderBlock) else module
        return [layer for child in children for layer in _layers(child)]
    if isinstance(module, Qwen3OmniMoeSnakeBeta):
        return []
    raise CheckpointError(f"code2wav: unknown ConvNet layer {type(module).__name__}")


@dataclass(frozen=True)
class ConvGeometry:
    """The ConvNet's index arithmetic (see the module docstring). Build with :meth:`of`."""

    layers: tuple[ConvLayer, ...]
    samples_per_frame: int

    @classmethod
    def of(cls, model: Qwen3OmniMoeCode2Wav) -> ConvGeometry:
        """Read from ``model``'s ``upsample`` and ``decoder``; CheckpointError for a layout this arithmetic does not
        describe (an unknown layer, a strided convolution, or a single frame that makes no sample)."""
        layers = tuple(_layers(model.upsample) + _layers(model.decoder))
        geometry = cls(layers, int(model.total_upsample))
        one, two = geometry.samples(1), geometry.samples(2)
        if one <= 0 or two - one != geometry.samples_per_frame:
            raise CheckpointError(
                f"code2wav: 1 and 2 frames make {one} and {two} samples; expected a positive count growing by "
                f"total_upsample ({geometry.samples_per_frame}) a frame"
            )
        return geometry

    def samples(self, frames: int) -> int:
        """Samples the ConvNet makes of ``frames`` hidden frames (what the module's forward returns)."""
        for layer in self.layers:
            frames = layer.length(frames)
        return frames

    @property
    def deficit(self) -> int:
        """``frames * samples_per_frame - samples(frames)`` for any ``frames >= 1``."""
        return self.samples_per_frame - self.samples(1)

    def frames_read(self, sample: int) -> tuple[int, int]:
        """The hidden frames ``[first, last]`` that output ``sample`` depends on (``first`` < 0: the zero padding
        before the utterance)."""
        lo = hi = sample
        for layer in reversed(self.layers):
            lo, hi = layer.inputs(lo, hi)
        return lo, hi

    @property
    def left_context_frames(self) -> int:
        """The most frames before its own that a sample reads: a window starting this many frames before the frame of
        its first kept sample computes every kept sample as the whole utterance's pass does."""
        spf = self.samples_per_frame
        return max(sample // spf - self.frames_read(sample)[0] for sample in range(spf))
