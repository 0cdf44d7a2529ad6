"""The reference of the frame talker's frames: the eager path the engine took before a frame was one graph-captured
step. The talker's decoder steps eagerly (the CPU attention that reads lengths on the host), codebook 0 is sampled by
the runner's sampler, and the code predictor runs as HF's own forward over a ``DynamicCache``
(:class:`tests.helpers.qwen3_code_predictor.CodePredictor`), its codebooks drawn by the runner's residual sampler with
the same noise counters. No chains: one frame per call.

:class:`EagerFrames` works on a :class:`~pipeline.runners.frame_talker.FrameTalkerRunner` of its own (its KV pool and
sampler tables), so that a test can run it beside the runner under test from the same cache contents, or put its
methods in place of a runner's (:meth:`EagerFrames.install`) to run a whole engine the old way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.runners.frame_talker import FrameTalkerRunner
from pipeline.runners.sampling import DeviceSampleRows, SampleRows
from tests.helpers.qwen3_code_predictor import CodePredictor


class EagerFrames:
    def __init__(self, runner: FrameTalkerRunner, talker) -> None:
        """``runner``: whose decoder, pool, samplers and parts the reference uses; ``talker``: the HF talker (its
        code predictor)."""
        self.runner = runner
        self.predictor = CodePredictor(talker)

    @torch.inference_mode()
    def start(self, inputs: torch.Tensor, *, slot: int, start: int, sample: SampleRows, rope=None) -> torch.Tensor:
        """:meth:`FrameTalkerRunner.start`: (groups,) int64, its prefill eager (the decoder's own prefill, never the
        graphed rows)."""
        r = self.runner
        r.decoder.check_host_rope(rope, inputs.shape[0])
        positions = None if rope is None else torch.as_tensor(rope).to(r.device, torch.long)
        hidden = r.decoder.prefill(slot, inputs.to(r.device, r.dtype), start, positions)
        return self.frames(hidden[-1:], sample)[0]

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
        """:meth:`FrameTalkerRunner.decode`: (B, groups) int64."""
        r = self.runner
        rope = None
        if rope_shifts is not None and any(rope_shifts):
            at = [p + d for p, d in zip(positions, rope_shifts, strict=True)]
            rope = torch.tensor([at, at, at])
        x = r.parts.step_inputs(torch.tensor([list(f) for f in frames]), text.to(r.dtype))
        hidden = r.decoder.decode(x.to(r.dtype), torch.tensor(slots), torch.tensor(positions), rope, graph_safe=False)
        return self.frames(hidden, sample)

    def frames(self, hidden: torch.Tensor, sample: SampleRows) -> torch.Tensor:
        """Codebook 0 sampled from ``hidden``'s logits, then the code predictor's codebooks; (B, groups)."""
        r = self.runner
        rows = sample.on(r.device)
        codes = r.sampler.sample_device(r.parts.head(hidden).float(), rows)
        neutral = torch.full_like(rows.rows, r.pool.scratch_slot)

        def pick(logits: torch.Tensor, step: int) -> torch.Tensor:
            counters = rows.counters * r.groups + step
            residual = DeviceSampleRows(neutral, torch.zeros_like(rows.force_continue), rows.seeds, counters)
            return r.residual_sampler.sample_device(logits, residual)

        rest = self.predictor.predict(hidden, codes, pick)
        return torch.cat([codes.view(-1, 1), rest.to(codes.device, torch.long)], dim=1)

    def install(self) -> None:
        """Make ``runner`` itself make its frames this way (its ``start`` and ``decode``); chains must then be off
        (``talker.chain_steps: 1``), as they were."""
        self.runner.start = self.start  # type: ignore[method-assign]
        self.runner.decode = self.decode  # type: ignore[method-assign]
