"""Shared by the Qwen3-Omni reference tests: transformers' greedy ``generate`` with the engine's stop token, the
engine's reply collected, and the comparison of both (text ids, all 16 codebooks, the streamed code2wav audio against
the one-shot decode of the same frames)."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.models.qwen3_omni.code2wav_stream import one_shot
from pipeline.response_events import AudioChunk, ResponseDone, ResponseStatus

THINKER_MAX = 12
TALKER_MAX = 60
VOICE = "Ethan"


def run_reference(model, special, input_ids: torch.Tensor, **kwargs) -> tuple[list[int], torch.Tensor]:
    """Reference generate with a greedy thinker and talker: (reply ids without the stop token, frames (T, 16))."""
    captured = {}
    chunked = model.code2wav.chunked_decode

    def record(codes, **kw):
        captured["codes"] = codes
        return chunked(codes, **kw)

    model.code2wav.chunked_decode = record
    try:
        with torch.inference_mode():
            seqs, _wav = model.generate(
                input_ids=input_ids,
                speaker=VOICE,
                thinker_max_new_tokens=THINKER_MAX,
                thinker_do_sample=False,
                thinker_repetition_penalty=1.0,
                thinker_eos_token_id=special.im_end,
                talker_do_sample=False,
                talker_max_new_tokens=TALKER_MAX,
                **kwargs,
            )
    finally:
        del model.code2wav.chunked_decode
    reply = [t for t in seqs[0, input_ids.shape[1] :].tolist() if t not in (special.im_end, special.endoftext)]
    return reply, captured["codes"][0].T


async def collect(resp) -> tuple[ResponseDone, np.ndarray]:
    events = [ev async for ev in resp]
    done = events[-1]
    assert isinstance(done, ResponseDone), done
    pcm = [ev.pcm for ev in events if isinstance(ev, AudioChunk)]
    return done, np.concatenate(pcm) if pcm else np.zeros(0, np.float32)


def template_ids(tokenizer, messages) -> torch.Tensor:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt")
    return ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids


def check_reply(engine, done: ResponseDone, pcm: np.ndarray, ref_text: list[int], ref_frames: torch.Tensor) -> None:
    assert done.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE), done.error
    assert list(done.text_token_ids) == ref_text
    assert len(ref_frames) >= 3, "the tiny talker should speak for a few frames"
    assert [list(f) for f in done.audio_codes] == ref_frames.tolist()
    # code2wav streamed == one shot over the same frames; only summation order differs (float32, batched shapes)
    expected = one_shot(engine.ckpt.code2wav, ref_frames.tolist())
    assert pcm.shape == expected.shape
    np.testing.assert_allclose(pcm, expected, atol=1e-4)
