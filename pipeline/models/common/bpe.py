"""A byte-level BPE tokenizer trained offline on :mod:`.tokenizer_corpus`, in the Qwen2 style (NFC normalizer, Qwen2's
pre-tokenization split, GPT-2 byte mapping), and the released tokenizer file set written from it.

Deterministic: the same corpus and ``tokenizers`` version give the same vocabulary, merges and files. A family appends
its own added tokens (in its released order) after the ``bpe_vocab_size`` BPE entries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import CheckpointError
from pipeline.models.common.tokenizer_corpus import CORPUS

QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenization split (contractions, letters, single digits, punctuation, spaces)."""


CHAT_ROLES = ("system", "user", "assistant")
"""The ChatML role words, in the order :func:`role_prefixed_corpus` cycles through them."""


def role_prefixed_corpus(corpus: Sequence[str] = CORPUS) -> tuple[str, ...]:
    """``corpus`` followed by each of its lines as a chat turn's text (``"{role}\n{line}"``, the roles cycling through
    :data:`CHAT_ROLES`): trained on it, the BPE has every role word as one token, as a checkpoint whose config names
    the role tokens' ids (``system_token_id``...) needs."""
    turns = tuple(f"{CHAT_ROLES[i % len(CHAT_ROLES)]}\n{line}" for i, line in enumerate(corpus))
    return tuple(corpus) + turns


def train_bpe(bpe_vocab_size: int, corpus: Iterable[str] = CORPUS) -> Any:
    """Train the byte-level BPE on ``corpus`` (default: the embedded one). Returns a ``tokenizers.Tokenizer`` with
    exactly ``bpe_vocab_size`` entries, added tokens not yet appended; :class:`CheckpointError`
    (``param="tokenizer_bpe_vocab"``) when the corpus cannot yield that many."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=bpe_vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    if tokenizer.get_vocab_size() != bpe_vocab_size:
        raise CheckpointError(
            f"tokenizer: the corpus yields {tokenizer.get_vocab_size()} BPE tokens, "
            f"not the {bpe_vocab_size} requested (spec.tokenizer_bpe_vocab)",
            param="tokenizer_bpe_vocab",
        )
    return tokenizer


def added_token_ids(bpe_vocab_size: int, tokens: Sequence[str]) -> dict[str, int]:
    """Ids of ``tokens`` (in order) when they are appended to a BPE vocabulary of ``bpe_vocab_size`` entries."""
    return {token: bpe_vocab_size + i for i, token in enumerate(tokens)}


def train_with_added_tokens(
    bpe_vocab_size: int, added: Sequence[tuple[str, bool]], corpus: Iterable[str] = CORPUS
) -> tuple[Any, dict[str, int]]:
    """:func:`train_bpe` on ``corpus``, then ``added`` (``(token, special)`` pairs, in order) appended unnormalized.
    Returns the tokenizer and the added tokens' ids; :class:`CheckpointError` if one did not get the id its order
    implies (a token that the BPE already holds)."""
    from tokenizers import AddedToken

    tokenizer = train_bpe(bpe_vocab_size, corpus)
    tokenizer.add_tokens([AddedToken(token, special=special, normalized=False) for token, special in added])
    ids = added_token_ids(bpe_vocab_size, [token for token, _ in added])
    for token, expected in ids.items():
        if tokenizer.token_to_id(token) != expected:
            raise CheckpointError(f"tokenizer: {token} got id {tokenizer.token_to_id(token)}, expected {expected}")
    return tokenizer, ids


def write_bpe_files(tokenizer: Any, out_dir: Path) -> None:
    """Write ``tokenizer.json``, ``vocab.json`` and ``merges.txt`` (the released Qwen file set but for the config)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    model = json.loads(tokenizer.to_str())["model"]
    (out_dir / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False))
    merges = ["#version: 0.2"] + [" ".join(pair) for pair in model["merges"]]
    (out_dir / "merges.txt").write_text("\n".join(merges) + "\n")


def write_tokenizer_files(out_dir: Path, tokenizer: Any, tokenizer_config: Mapping[str, Any]) -> None:
    """The released Qwen tokenizer file set: the BPE files (:func:`write_bpe_files`), ``tokenizer_config.json`` and
    ``chat_template.json`` (the config's ``chat_template``, which stands in both files as released)."""
    write_bpe_files(tokenizer, out_dir)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(dict(tokenizer_config), indent=2) + "\n")
    template = {"chat_template": tokenizer_config["chat_template"]}
    (out_dir / "chat_template.json").write_text(json.dumps(template, indent=2) + "\n")


def added_tokens_decoder(ids: dict[str, int], added: Sequence[tuple[str, bool]]) -> dict[str, dict[str, Any]]:
    """The ``added_tokens_decoder`` entry of a ``tokenizer_config.json`` for ``added`` with ``ids``."""
    return {
        str(ids[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for token, special in added
    }


def jinja_text(text: str) -> str:
    """``text`` as a Jinja expression of a string literal (written out as is, newlines included)."""
    return "{{ " + json.dumps(text) + " }}"
