"""The non-weight files of a random Qwen3-Omni checkpoint: tokenizer (byte-level BPE + the released added tokens),
chat template and ``preprocessor_config.json``, in the released file set (``generation_config.json``:
:func:`pipeline.models.common.random_checkpoint.generation_config`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.models.common import bpe, random_checkpoint
from pipeline.models.common.hermes_tools import TOOLS_EPILOGUE, TOOLS_PREAMBLE
from pipeline.models.qwen3_omni import released
from pipeline.models.qwen3_omni.tiny_config import ADDED_TOKENS

if TYPE_CHECKING:
    from pipeline.models.qwen3_omni.tiny_spec import Qwen3OmniRandomModelSpec

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
AUDIO_PART = "<|audio_start|><|audio_pad|><|audio_end|>"
IMAGE_PART = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PART = "<|vision_start|><|video_pad|><|vision_end|>"
"""How the chat template writes a content part of each medium (the processor expands the pad token)."""

TOOLS_HEADER = TOOLS_PREAMBLE.removeprefix("\n\n")
TOOLS_FOOTER = TOOLS_EPILOGUE
"""The system message's tools block around the tool list: Qwen3's chat template words it as Qwen2.5's (the blank line
before it is written only after a system message's content)."""

MODEL_MAX_LENGTH = 65_536
"""The tokenizer's ``model_max_length``: the thinker's position budget."""


def _t(text: str) -> str:
    # Literal text as a Jinja string: transformers renders with trim_blocks, which eats a newline right after a tag.
    return bpe.jinja_text(text)


def chat_template() -> str:
    """A Jinja chat template that renders like the released Qwen3-Omni one (written for this project):

    * no default system message; with ``tools=``, a system turn holding the system message's content (if the first
      message is one), a blank line, then the tools block (each tool as JSON on its own line);
    * ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message; a content list writes its text parts and one
      ``<|audio_start|><|audio_pad|><|audio_end|>`` / ``<|vision_start|><|image_pad|><|vision_end|>`` /
      ``<|vision_start|><|video_pad|><|vision_end|>`` per medium, in order;
    * an assistant's ``tool_calls`` as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` blocks after
      its content (a newline between), arguments written as given when a string, as JSON otherwise; an assistant's
      earlier reasoning (text up to ``</think>``) is dropped;
    * consecutive ``tool`` messages as one user turn of ``<tool_response>`` blocks;
    * ``<|im_start|>assistant\\n`` for ``add_generation_prompt``.

    Written on one line with every literal as a Jinja string (see :func:`_t`).
    """
    render = "".join(
        [
            "{% macro render(content) %}",
            "{% if content is string %}{{ content }}{% elif content %}{% for part in content %}",
            "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}",
            _t(IMAGE_PART),
            "{% elif part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}",
            _t(AUDIO_PART),
            "{% elif part['type'] == 'video' or 'video' in part %}",
            _t(VIDEO_PART),
            "{% elif 'text' in part %}{{ part['text'] }}{% endif %}",
            "{% endfor %}{% endif %}{% endmacro %}",
        ]
    )
    system = "".join(
        [
            "{% if tools %}",
            _t(IM_START + "system\n"),
            "{% if messages[0]['role'] == 'system' %}{{ render(messages[0]['content']) }}",
            _t("\n\n"),
            "{% endif %}",
            _t(TOOLS_HEADER),
            "{% for tool in tools %}",
            _t("\n"),
            "{{ tool | tojson }}{% endfor %}",
            _t(TOOLS_FOOTER + IM_END + "\n"),
            "{% elif messages[0]['role'] == 'system' %}",
            _t(IM_START + "system\n"),
            "{{ render(messages[0]['content']) }}",
            _t(IM_END + "\n"),
            "{% endif %}",
        ]
    )
    assistant = "".join(
        [
            "{% set text = render(message['content']) | string %}",
            "{% if '</think>' in text %}{% set text = text.split('</think>')[-1].lstrip('\\n') %}{% endif %}",
            _t(IM_START + "assistant\n"),
            "{{ text }}",
            "{% for call in message['tool_calls'] or [] %}",
            "{% if not loop.first or text %}",
            _t("\n"),
            "{% endif %}",
            "{% set fn = call['function'] if call['function'] is defined else call %}",
            _t('<tool_call>\n{"name": "'),
            "{{ fn['name'] }}",
            _t('", "arguments": '),
            "{% if fn['arguments'] is string %}{{ fn['arguments'] }}",
            "{% else %}{{ fn['arguments'] | tojson }}{% endif %}",
            _t("}\n</tool_call>"),
            "{% endfor %}",
            _t(IM_END + "\n"),
        ]
    )
    tool = "".join(
        [
            "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}",
            _t(IM_START + "user"),
            "{% endif %}",
            _t("\n<tool_response>\n"),
            "{{ render(message['content']) }}",
            _t("\n</tool_response>"),
            "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}",
            _t(IM_END + "\n"),
            "{% endif %}",
        ]
    )
    return "".join(
        [
            render,
            system,
            "{% for message in messages %}",
            "{% if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}",
            _t(IM_START),
            "{{ message['role'] }}",
            _t("\n"),
            "{{ render(message['content']) }}",
            _t(IM_END + "\n"),
            "{% elif message['role'] == 'assistant' %}",
            assistant,
            "{% elif message['role'] == 'tool' %}",
            tool,
            "{% endif %}",
            "{% endfor %}",
            "{% if add_generation_prompt %}",
            _t(IM_START + "assistant\n"),
            "{% endif %}",
        ]
    )


def write_tokenizer(out_dir: Path, spec: Qwen3OmniRandomModelSpec) -> dict[str, int]:
    """Write tokenizer.json, vocab.json, merges.txt, tokenizer_config.json and chat_template.json (the released file
    set) for ``spec`` and return the added tokens' ids."""
    tokenizer, ids = bpe.train_with_added_tokens(spec.tokenizer_bpe_vocab, ADDED_TOKENS, bpe.role_prefixed_corpus())
    bpe.write_tokenizer_files(out_dir, tokenizer, _tokenizer_config(ids, chat_template()))
    return ids


def _tokenizer_config(ids: dict[str, int], template: str) -> dict[str, Any]:
    return {
        **released.TOKENIZER,
        "model_max_length": MODEL_MAX_LENGTH,
        "extra_special_tokens": dict(released.TOKENIZER_NAMED_TOKENS),
        "added_tokens_decoder": bpe.added_tokens_decoder(ids, ADDED_TOKENS),
        "chat_template": template,
    }


def write_preprocessor_config(out_dir: Path, spec: Qwen3OmniRandomModelSpec) -> None:
    """``preprocessor_config.json`` as released: the Whisper feature extractor's settings and the image processor's in
    one object, with ``spec``'s pixel budget, patch sizes and normalisation."""
    settings = released.PREPROCESSOR
    whisper = ("feature_size", "sampling_rate", "hop_length", "n_fft", "chunk_length", "padding_value", "dither")
    random_checkpoint.write_preprocessor_config(
        out_dir,
        {**{name: settings[name] for name in whisper}, "return_attention_mask": settings["return_attention_mask"]},
        {
            "processor_class": settings["processor_class"],
            "image_processor_type": settings["image_processor_type"],
            "patch_size": spec.vision_patch_size,
            "temporal_patch_size": spec.vision_temporal_patch_size,
            "merge_size": spec.vision_merge_size,
            "min_pixels": spec.image_min_pixels,
            "max_pixels": spec.image_max_pixels,
            "image_mean": list(spec.image_mean),
            "image_std": list(spec.image_std),
        },
    )


__all__ = ["chat_template", "write_preprocessor_config", "write_tokenizer"]
