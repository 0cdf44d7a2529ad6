"""Comparing a reply the engine gave with its incremental KV cache to the same reply from a one-shot prefill."""

from __future__ import annotations

from pipeline.response_events import ResponseStatus


def core_conv(engine, conv):
    """The engine thread's state of ``conv`` (an engine core running on a thread of this process)."""
    return engine.core.conversations.get(conv.id)


async def reply_and_one_shot(engine, conv, item_id: str, **kwargs):
    """The reply as the incremental engine gives it, then the same reply recomputed from a one-shot
    prefill (delete it, drop every cache, respond again); returns both ResponseDone."""
    first = await conv.respond(item_id=item_id, **kwargs).wait()
    state = core_conv(engine, conv)
    await conv.delete_item(item_id)
    await engine._call(lambda core: state.free())
    again = await conv.respond(item_id=item_id, **kwargs).wait()
    return first, again


def assert_same_reply(a, b):
    assert a.status is not ResponseStatus.FAILED, a.error
    assert a.text_token_ids == b.text_token_ids
    assert a.audio_codes == b.audio_codes
