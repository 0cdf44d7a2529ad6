"""The reference's inputs for conversations with pictures: transformers' thinker fed what the engine was given
(the chat template, the processor's placeholder expansion done by hand, the same pixel values)."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.models.qwen2_5_omni.prompt import DEFAULT_SYSTEM_PROMPT

REPLY_MARK = "@@reply@@"


def picture(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


PICTURES = [picture(1, 60, 90), picture(2, 120, 40)]


def reference_inputs(
    engine, tokenizer, turns: list[tuple[list, list[int]]], *, system_prompt: str = DEFAULT_SYSTEM_PROMPT
) -> dict:
    """The reference's inputs for ``turns`` (user content parts, the assistant's earlier reply ids; the last turn's
    reply is what is generated) after the system message ``system_prompt`` (default: Qwen2.5-Omni's):
    ``input_ids`` (1, L), ``pixel_values``, ``image_grid_thw``, with the processor's placeholder expansion done by
    hand. Earlier replies go in as their ids (a random model's text need not survive decoding and re-encoding)."""
    core = engine.core
    preprocess = core.family.vision_preprocessor(core.ckpt)
    special = core.special
    merged = engine.vision.merge_size**2
    messages = [{"role": "system", "content": [{"type": "text", "text": system_prompt}]}]
    pixels, grids = [], []
    for parts, reply in turns:
        content = []
        for part in parts:
            if isinstance(part, str):
                content.append({"type": "text", "text": part})
            else:
                vi = preprocess([part])
                pixels.append(vi.pixel_values)
                grids.append(vi.grid_thw)
                content.append({"type": "image"})
        messages.append({"role": "user", "content": content})
        if reply:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": REPLY_MARK}]})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pieces = text.split(REPLY_MARK)
    replies = [reply for _, reply in turns if reply]
    tokens = tokenizer.encode(pieces[0], add_special_tokens=False)
    for reply, piece in zip(replies, pieces[1:]):
        tokens += reply + tokenizer.encode(piece, add_special_tokens=False)
    ids: list[int] = []
    k = 0
    for token in tokens:
        if token == special.image_token:
            t, h, w = grids[k]
            ids += [token] * (t * h * w // merged)
            k += 1
        else:
            ids.append(token)
    return dict(
        input_ids=torch.tensor([ids]),
        pixel_values=torch.from_numpy(np.concatenate(pixels)),
        image_grid_thw=torch.tensor(grids),
    )


class OneDPositions:
    """A family's position scheme with every rope position at its cache index (pictures' offsets kept): what a model
    blind to 3-D positions would run at."""

    def __init__(self, scheme) -> None:
        self.image_offsets = scheme.image_offsets

    @staticmethod
    def rope_positions(length, spans, start=0):
        return None

    @staticmethod
    def rope_shift(spans, length):
        return 0
