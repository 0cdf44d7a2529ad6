"""The Qwen3-Omni talker's inputs, streamed text token by text token: its prompt, its per-step text part, the frame
embedding it is fed back, and the rules its codebook-0 sampling follows. transformers'
``Qwen3OmniMoeForConditionalGeneration.generate`` builds the same after the thinker has finished; here each piece is
computable as soon as the thinker has produced what it needs.

The talker's prompt (``P`` positions, talker hidden ``H``):

- the *user part*: every thinker position whose role is ``user`` (:func:`user_mask`: the role token after the
  latest ``<|im_start|>``; system turns and earlier assistant replies are left out, the newline after a user turn's
  ``<|im_end|>`` is kept), in order, each ``hidden_projection(thinker hidden at accept_hidden_layer)`` at an audio,
  image or video placeholder and ``text_projection(thinker input embedding)`` elsewhere
  (:meth:`TalkerInputs.user_part`, computable chunk by chunk as the thinker prefills);
- the *assistant part*, 9 positions made at reply start from the prompt's ``<|im_start|>assistant\\n`` ids, the speaker
  and reply token 0 (:meth:`TalkerInputs.assistant_part`).

Decode step ``n`` (n = 0, 1, ...) feeds ``frame_embedding(codes of frame n) + text part n``; text part ``n`` is reply
token ``n + 1``'s :meth:`~TalkerInputs.text_vector` while that token is not the reply's last, ``tts_eos`` in place of
the reply's last token (the stop token, or the last token of a reply cut at its length limit: the reference never
feeds the last generated token through the thinker, so it is never projected), then ``tts_pad`` forever
(:func:`step_text`). Call the methods here under ``torch.inference_mode()``; tensors come back on the talker's device.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from pipeline.errors import CheckpointError, InvalidInputError, UnknownVoiceError
from pipeline.kernels.cuda_graphs import host_to_device

__all__ = [
    "ASSISTANT_PART_LEN",
    "CodecRules",
    "TalkerInputs",
    "TalkerTokens",
    "TalkerTextEnd",
    "multimodal_mask",
    "step_text",
    "user_mask",
]

ASSISTANT_PART_LEN = 9
"""Positions of the assistant part: ``<|im_start|>``, ``assistant``, ``\\n``, tts_pad x4, tts_bos, reply token 0."""
_CONTROL_IDS = 1024
"""The reference's ``generate`` suppresses the last this many talker-vocabulary ids (codec eos excepted)."""


@dataclass(frozen=True)
class TalkerTokens:
    """Every id the talker's prompt, loop and positions use, read from a ``Qwen3OmniMoeConfig`` (:meth:`of`).
    Thinker-vocabulary ids: ``im_start`` .. ``vision_start``; talker-vocabulary (codec) ids: ``codec_*`` and
    ``speakers`` (lower-case name -> id)."""

    im_start: int
    user: int
    assistant: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    audio: int
    image: int
    video: int
    vision_start: int
    audio_start: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    speakers: Mapping[str, int]
    accept_hidden_layer: int
    """Index into the thinker's ``hidden_states`` (0: the input embeddings; k: decoder layer k-1's output)."""
    code_groups: int
    vocab: int
    """The talker's codebook-0 vocabulary (codes, then control ids)."""
    position_id_per_seconds: float
    spatial_merge_size: int

    @classmethod
    def of(cls, config) -> TalkerTokens:
        talker = config.talker_config
        merge = getattr(talker, "spatial_merge_size", None)
        if merge is None:
            raise CheckpointError("talker_config lacks spatial_merge_size", param="talker_config.spatial_merge_size")
        if talker.code_predictor_config.num_code_groups != talker.num_code_groups:
            raise CheckpointError("the talker and its code predictor disagree on num_code_groups")
        return cls(
            im_start=config.im_start_token_id,
            user=config.user_token_id,
            assistant=config.assistant_token_id,
            tts_pad=config.tts_pad_token_id,
            tts_bos=config.tts_bos_token_id,
            tts_eos=config.tts_eos_token_id,
            audio=config.thinker_config.audio_token_id,
            image=config.thinker_config.image_token_id,
            video=config.thinker_config.video_token_id,
            vision_start=talker.vision_start_token_id,
            audio_start=talker.audio_start_token_id,
            codec_pad=talker.codec_pad_id,
            codec_bos=talker.codec_bos_id,
            codec_eos=talker.codec_eos_token_id,
            codec_nothink=talker.codec_nothink_id,
            codec_think_bos=talker.codec_think_bos_id,
            codec_think_eos=talker.codec_think_eos_id,
            speakers=dict(talker.speaker_id or {}),
            accept_hidden_layer=talker.accept_hidden_layer,
            code_groups=talker.num_code_groups,
            vocab=talker.text_config.vocab_size,
            position_id_per_seconds=talker.position_id_per_seconds,
            spatial_merge_size=merge,
        )

    def speaker(self, name: str) -> int:
        """The codec id of speaker ``name`` (case-insensitive, as the reference looks it up)."""
        try:
            return self.speakers[name.lower()]
        except KeyError:
            known = ", ".join(sorted(self.speakers))
            raise UnknownVoiceError(f"unknown voice {name!r} (this checkpoint has {known})", param="voice") from None


def user_mask(ids: torch.Tensor, tokens: TalkerTokens) -> torch.Tensor:
    """(L,) bool: the positions of thinker prompt ``ids`` (L,) that the talker's user part takes, by the reference's
    rule: a position's role is the token after the latest ``<|im_start|>`` at or before it (positions before the
    first ``<|im_start|>`` take the role after position 0, as the reference's clamp does)."""
    index = torch.arange(ids.shape[0], device=ids.device)
    starts = torch.where(ids == tokens.im_start, index, torch.full_like(index, -1))
    latest = torch.cummax(starts, dim=0).values.clamp_min(0)
    roles = ids[(latest + 1).clamp_max(ids.shape[0] - 1)]
    return roles == tokens.user


def multimodal_mask(ids: torch.Tensor, tokens: TalkerTokens) -> torch.Tensor:
    """Positions of ``ids`` that hold audio, image or video features (the talker takes the thinker's hidden state
    there)."""
    return (ids == tokens.audio) | (ids == tokens.image) | (ids == tokens.video)


class TalkerTextEnd(enum.Enum):
    """Text parts past the reply's text: ``EOS`` once (in place of the reply's last token), then ``PAD``."""

    EOS = "tts_eos"
    PAD = "tts_pad"


def step_text(step: int, known: int, done: bool) -> int | TalkerTextEnd | None:
    """The text part of talker decode step ``step`` (0 = the step after the prefill) when the thinker has produced
    reply tokens ``0 .. known - 1`` and ``done`` says whether token ``known - 1`` is the reply's last: the index of the
    reply token whose :meth:`TalkerInputs.text_vector` it takes, a :class:`TalkerTextEnd`, or None (wait for the
    thinker: the talker never runs ahead of the text)."""
    if step < 0 or known < 1:
        raise InvalidInputError("a talker step needs step >= 0 and reply token 0 known", param="step")
    token = step + 1
    if not done:
        return token if token < known else None
    if known < 2:
        raise InvalidInputError("a reply whose first token is its last has no talker (the reference has no prompt)")
    if token < known - 1:
        return token
    return TalkerTextEnd.EOS if token == known - 1 else TalkerTextEnd.PAD


class TalkerInputs:
    """The talker's input vectors from the thinker's: owns no state but the three ``tts_*`` vectors.

    ``talker``: the HF ``Qwen3OmniMoeTalkerForConditionalGeneration``; ``thinker_embedding``: the thinker's input
    embedding (``nn.Embedding``). Returned vectors are (n, H) in the talker's dtype, on its device."""

    def __init__(self, talker, thinker_embedding: torch.nn.Embedding, tokens: TalkerTokens) -> None:
        self.talker = talker
        self.embed = thinker_embedding
        self.tokens = tokens
        self.codec_embedding = talker.model.get_input_embeddings()
        self.residual_embeddings = talker.code_predictor.get_input_embeddings()
        with torch.inference_mode():
            bos, eos, pad = self.text_vectors([tokens.tts_bos, tokens.tts_eos, tokens.tts_pad])
        self.tts_bos, self.tts_eos, self.tts_pad = bos, eos, pad
        """(H,) each: the projected thinker embeddings of the ``tts_*`` ids."""

    @property
    def device(self) -> torch.device:
        return self.codec_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.codec_embedding.weight.dtype

    def text_vectors(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """(n, H): ``text_projection`` of the thinker's input embeddings of ``token_ids``."""
        device = self.embed.weight.device
        if isinstance(token_ids, torch.Tensor) and token_ids.device.type != "cpu":
            ids = token_ids.to(device, torch.long)
        else:  # queued without the host waiting for the device (a copy from pageable memory waits)
            ids = host_to_device(token_ids, torch.long, device)
        return self.project_text(self.embed(ids.reshape(-1)))

    def text_vector(self, token_id: int) -> torch.Tensor:
        """(H,): the text part a reply token gives a talker step."""
        return self.text_vectors([token_id])[0]

    def end_vector(self, end: TalkerTextEnd) -> torch.Tensor:
        return self.tts_eos if end is TalkerTextEnd.EOS else self.tts_pad

    def project_text(self, embeds: torch.Tensor) -> torch.Tensor:
        """(n, H): ``text_projection`` of thinker input embeddings (n, H_thinker)."""
        proj = self.talker.text_projection
        return proj(embeds.to(proj.linear_fc1.weight.device, proj.linear_fc1.weight.dtype)).to(self.dtype)

    def user_part(
        self, ids: torch.Tensor, hidden: torch.Tensor | None, embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(n, H) talker prompt vectors of ``n`` user-role thinker positions (:func:`user_mask`), in order, from their
        ids (n,) and the thinker's hidden states at ``accept_hidden_layer`` ``hidden`` (n, H_thinker; read only at
        audio/image/video placeholders; None when there are none). ``embeds`` (n, H_thinker): the thinker's input
        embeddings of the positions (None: looked up from ``ids``, which is what they are at text positions).
        Positions are independent: a turn's part may be made chunk by chunk as the thinker prefills."""
        ids = ids.reshape(-1)
        if (hidden is not None and hidden.shape[0] != ids.shape[0]) or (
            embeds is not None and embeds.shape[0] != ids.shape[0]
        ):
            raise InvalidInputError("user part: ids, hidden and embeds must have one row per position")
        # rows picked by host-side indices, copied to the device without waiting: a boolean mask on the device (or a
        # copy from pageable memory) would make the host wait for the GPU on a reply's way to its first frame
        mm = multimodal_mask(ids, self.tokens).cpu()
        multimodal, text = torch.nonzero(mm).flatten(), torch.nonzero(~mm).flatten()
        out = torch.empty(ids.shape[0], self.codec_embedding.embedding_dim, dtype=self.dtype, device=self.device)
        if multimodal.numel():
            if hidden is None:
                raise InvalidInputError("user part: multimodal positions need the thinker's hidden states")
            proj = self.talker.hidden_projection
            rows = hidden.index_select(0, host_to_device(multimodal, torch.long, hidden.device))
            projected = proj(rows.to(proj.linear_fc1.weight.device, proj.linear_fc1.weight.dtype)).to(self.device)
            out.index_copy_(0, host_to_device(multimodal, torch.long, self.device), projected.to(self.dtype))
        if text.numel():
            if embeds is None:
                vectors = self.text_vectors(ids.cpu()[text])
            else:
                vectors = self.project_text(embeds.index_select(0, host_to_device(text, torch.long, embeds.device)))
            out.index_copy_(0, host_to_device(text, torch.long, self.device), vectors.to(self.device))
        return out

    def assistant_part(self, header_ids: Sequence[int], speaker: int, first_token: int | torch.Tensor) -> torch.Tensor:
        """(9, H): the talker prompt's last positions, from the prompt's last three ids ``header_ids``
        (``<|im_start|>``, ``assistant``, the newline), the speaker's codec id and reply token 0 (its id, or its
        thinker input embedding (H_thinker,)) — text part
        [header x3, tts_pad x4, tts_bos, token 0] plus codec part [0 x3, nothink, think_bos, think_eos, speaker,
        codec_pad, codec_bos]. Its logits give frame 0's codebook-0 code."""
        t = self.tokens
        header = list(header_ids)
        if len(header) != 3 or header[0] != t.im_start or header[1] != t.assistant:
            raise InvalidInputError("the prompt must end with <|im_start|>assistant and a newline", param="header_ids")
        if isinstance(first_token, torch.Tensor):
            first = self.project_text(first_token.reshape(1, -1))
        else:
            first = self.text_vectors([first_token])
        head = self.text_vectors(header)
        pad = self.tts_pad.expand(4, -1)
        text = torch.cat((head, pad, self.tts_bos[None], first))
        special = [t.codec_nothink, t.codec_think_bos, t.codec_think_eos, speaker, t.codec_pad, t.codec_bos]
        codec = self.codec_embedding(host_to_device(special, torch.long, self.device))
        codec = torch.cat((codec.new_zeros(3, codec.shape[1]), codec))
        return text + codec

    def assistant_ids(self) -> list[int]:
        """The talker input ids of the assistant part (its rope positions read them): tts_pad x 9."""
        return [self.tokens.tts_pad] * ASSISTANT_PART_LEN

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, H): the sum of a frame's codebook embeddings, ``codes`` (B, code_groups): codebook 0 through the
        talker's codec embedding, codebook j >= 1 through the code predictor's embedding j - 1 (summed in the
        reference's order)."""
        if codes.ndim != 2 or codes.shape[1] != self.tokens.code_groups:
            raise InvalidInputError(f"frame codes must be (B, {self.tokens.code_groups})", param="codes")
        codes = codes.to(self.device, torch.long)
        parts = [self.codec_embedding(codes[:, 0])]
        parts += [self.residual_embeddings[j - 1](codes[:, j]) for j in range(1, codes.shape[1])]
        return torch.stack(parts, dim=1).sum(1)


@dataclass(frozen=True)
class CodecRules:
    """How the talker's codebook-0 code is drawn (transformers' ``generate`` order: repetition penalty over the codes
    this reply has drawn so far — none at the prefill —, the suppressed ids, then when sampling temperature,
    top-k, top-p). ``stop``: codec eos, which ends the reply's audio (it has no frame). ``suppress``: the last 1024
    ids of the talker's vocabulary but ``stop``. The sampling values are the reference ``generate``'s defaults
    (``config.json`` has none); greedy decoding still applies the penalty and suppression."""

    stop: int
    suppress: tuple[int, ...]
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05

    @classmethod
    def of(cls, tokens: TalkerTokens, **sampling) -> CodecRules:
        first = max(tokens.vocab - _CONTROL_IDS, 0)
        suppress = tuple(i for i in range(first, tokens.vocab) if i != tokens.codec_eos)
        return cls(stop=tokens.codec_eos, suppress=suppress, **sampling)

    def process(self, logits: torch.Tensor, history: Sequence[Sequence[int]]) -> torch.Tensor:
        """(B, V) float logits with the repetition penalty (row b over the codes in ``history[b]``) and the
        suppression applied, as ``generate`` applies them before a greedy argmax or the sampling warpers."""
        out = logits.float().clone()
        for row, seen in zip(out, history, strict=True):
            if seen:
                idx = torch.as_tensor(sorted(set(seen)), dtype=torch.long, device=out.device)
                score = row[idx]
                row[idx] = torch.where(score < 0, score * self.repetition_penalty, score / self.repetition_penalty)
        out[:, torch.as_tensor(self.suppress, dtype=torch.long, device=out.device)] = float("-inf")
        return out
