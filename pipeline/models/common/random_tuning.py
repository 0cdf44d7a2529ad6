"""Weight changes both families' random checkpoints use so that a random model ends its replies on its own: a residual
channel that no decoder layer writes, read by one head row as a bias, and an embedding channel that marks the text-end
inputs. In place, on a model built in float32 or a lower precision; run under ``torch.no_grad``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from pipeline.models.common.hf_parts import thinker_text_model

if TYPE_CHECKING:
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerForConditionalGeneration

__all__ = ["REPLY_END_NOISE_SCALE", "hold_reply_end_logit", "mark_text_end", "never_write"]

REPLY_END_NOISE_SCALE = 0.1
"""The share of its random weights the thinker's end row keeps (its logit's spread around the level)."""


@torch.no_grad()
def never_write(layers: Any, channel: int) -> None:
    """Zero every path by which a decoder layer writes residual ``channel``: the attention output projection and the
    MLP's (a dense MLP's down projection; a mixture of experts' routed experts, and its shared expert where there is
    one)."""
    for layer in layers:
        layer.self_attn.o_proj.weight[channel] = 0.0
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            mlp.experts.down_proj[:, channel, :] = 0.0
        else:
            mlp.down_proj.weight[channel] = 0.0
        if getattr(mlp, "shared_expert", None) is not None:
            mlp.shared_expert.down_proj.weight[channel] = 0.0


@torch.no_grad()
def hold_reply_end_logit(
    thinker: Qwen2_5OmniThinkerForConditionalGeneration | Qwen3OmniMoeThinkerForConditionalGeneration,
    end_id: int,
    level: float,
) -> None:
    """Make ``end_id``'s logit ``level`` plus a little noise at every text position.

    The last channel of the residual stream is made a constant: the same value in every token's embedding and never
    written by a layer (:func:`never_write`). After the final norm it is nearly constant too, so a language-model-head
    row that reads only that channel acts as a bias. The head's other rows stop reading it; the end row keeps
    :data:`REPLY_END_NOISE_SCALE` of its random weights so its logit still varies a little. The channel's normed value
    is measured on a probe of token ids to calibrate the row.
    """
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerTextModel
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextModel

    text = thinker_text_model(thinker)
    if not isinstance(text, (Qwen2_5OmniThinkerTextModel, Qwen3OmniMoeThinkerTextModel)):
        raise TypeError(f"not a Qwen-Omni thinker text model: {type(text).__name__}")
    embed = text.embed_tokens.weight
    channel = embed.shape[1] - 1
    embed[:, channel] = 3.0 * embed[:, :channel].std()
    never_write(text.layers, channel)
    head = thinker.lm_head.weight
    head[:, channel] = 0.0
    head[end_id].mul_(REPLY_END_NOISE_SCALE)
    probe = torch.arange(256, device=embed.device).reshape(4, 64) % embed.shape[0]
    normed = text(input_ids=probe).last_hidden_state[..., channel].float().mean()
    head[end_id, channel] = level / normed.item()


@torch.no_grad()
def mark_text_end(embed: torch.Tensor, marked: list[int], marker: int) -> None:
    """Make embedding channel ``marker`` non-zero only in the rows of ``marked`` (the text-end inputs), at three times
    the spread of the channels before it."""
    embed[:, marker] = 0.0
    embed[marked, marker] = 3.0 * embed[:, :marker].std()
