"""``input_image`` parts through the session runner on the FakeEngine: decoding, the detail budgets, usage, and
every bad picture (each an ``error`` event with its code; the session and its conversation carry on). Events are
validated with the ``openai`` SDK's models."""

from __future__ import annotations

import base64
import io

import numpy as np
import pydantic
import pytest
from PIL import Image

from realtime.media.images import ImageLimits
from realtime.session import SessionSettings
from tests.fakes import TINY_VISION, FakeEngine
from tests.helpers.session_harness import MANUAL, TEXT_ITEM, Harness

openai = pytest.importorskip("openai")
from openai.types.realtime import RealtimeServerEvent  # noqa: E402

GA_EVENTS = pydantic.TypeAdapter(RealtimeServerEvent)


def picture(width: int, height: int, fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(0)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(out, format=fmt)
    return out.getvalue()


def data_uri(data: bytes, media_type: str = "image/jpeg") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def image_item(url: str, detail: str | None = None, text: str | None = "What is this?", item_id: str | None = None):
    part = {"type": "input_image", "image_url": url} | ({"detail": detail} if detail else {})
    content = ([{"type": "input_text", "text": text}] if text else []) + [part]
    item = {"type": "message", "role": "user", "content": content} | ({"id": item_id} if item_id else {})
    return {"type": "conversation.item.create", "event_id": "evt_pic", "item": item}


def seeing(**kwargs) -> Harness:
    return Harness(FakeEngine(vision=TINY_VISION), **kwargs)


async def test_a_picture_reaches_the_engine_downscaled_and_usage_counts_its_tokens():
    async with seeing() as h:
        h.send(MANUAL, image_item(data_uri(picture(1600, 1200)), item_id="pic"), {"type": "response.create"})
        done = await h.transport.wait_for("response.done")
        added = next(e for e in h.transport.sent if e["type"] == "conversation.item.added")
        for event in h.transport.sent:
            GA_EVENTS.validate_python(event)
    assert added["item"]["content"] == [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "detail": "auto"},
    ]
    # auto = high: at most 1280 positions; 1600x1200 scaled by sqrt(1920000 / 1003520) and floored
    # to the 28-pixel grid -> 1148x840 (41 x 30 = 1230 positions)
    assert h.calls("add_content") == [("add_content", "pic", ("text", (840, 1148, 3)))]
    assert done["response"]["status"] == "completed"
    assert done["response"]["usage"]["input_token_details"]["image_tokens"] == 30 * 41


async def test_low_detail_has_a_smaller_budget_and_png_works():
    async with seeing() as h:
        h.send(MANUAL, image_item(data_uri(picture(800, 600, "PNG"), "image/png"), detail="low", text=None))
        await h.transport.wait_for("conversation.item.done")
    ((_, _, (shape,)),) = h.calls("add_content")
    assert shape[0] % 28 == 0 and shape[1] % 28 == 0
    assert shape[0] * shape[1] <= ImageLimits().low_detail_pixels
    assert shape == (364, 504, 3)


BAD = [
    ("http", "https://example.com/cat.jpg", "unsupported_value"),
    ("not a data uri", "cat.jpg", "invalid_image_url"),
    ("not base64", "data:image/jpeg;base64,@@@@", "invalid_image_url"),
    ("not base64 encoded", "data:image/jpeg," + "x" * 10, "invalid_image_url"),
    ("a gif", data_uri(b"GIF89a....", "image/gif"), "unsupported_image_format"),
    ("text as jpeg", data_uri(b"hello, I am not a picture at all"), "unsupported_image_format"),
    ("corrupt jpeg", data_uri(picture(64, 64)[:200]), "invalid_image"),
    ("empty", "data:image/png;base64,", "invalid_image"),
]


@pytest.mark.parametrize(("url", "code"), [(url, code) for _, url, code in BAD], ids=[name for name, _, _ in BAD])
async def test_a_bad_picture_is_an_error_and_the_session_carries_on(url, code):
    async with seeing() as h:
        h.send(MANUAL, TEXT_ITEM, image_item(url))
        error = await h.transport.wait_for("error")
        h.send({"type": "response.create"})
        done = await h.transport.wait_for("response.done")
    assert error["error"]["code"] == code, error
    assert error["error"]["event_id"] == "evt_pic"
    assert error["error"]["param"] == "item.content.1.image_url"
    assert done["response"]["status"] == "completed"
    assert h.calls("add_content") == []
    assert [c[0] for c in h.conversation.calls] == ["open", "add_text", "respond", "close"]  # the state is intact
    assert sum(e["type"] == "conversation.item.added" for e in h.transport.sent) == 2  # the text item, the reply


@pytest.mark.parametrize(
    ("limits", "size"),
    [(ImageLimits(max_bytes=10_000), (200, 200)), (ImageLimits(max_pixels=100 * 100), (101, 100))],
    ids=["bytes", "pixels"],
)
async def test_an_oversized_picture_is_refused(limits, size):
    settings = SessionSettings.for_engine(FakeEngine(vision=TINY_VISION), image_limits=limits)
    async with seeing(settings=settings) as h:
        h.send(MANUAL, image_item(data_uri(picture(*size, "PNG"), "image/png")))
        error = await h.transport.wait_for("error")
    assert error["error"]["code"] == "image_too_large"
    assert h.calls("add_content") == []


async def test_a_zero_sized_png_is_invalid():
    # a PNG header claiming 0 x 0 pixels: PIL refuses it while reading the header
    header = picture(1, 1, "PNG")
    zero = header[:16] + (0).to_bytes(4, "big") + (0).to_bytes(4, "big") + header[24:]
    async with seeing() as h:
        h.send(MANUAL, image_item(data_uri(zero, "image/png")))
        error = await h.transport.wait_for("error")
    assert error["error"]["code"] == "invalid_image"


async def test_pictures_on_a_model_that_cannot_see_are_refused():
    async with Harness() as h:
        h.send(MANUAL, image_item(data_uri(picture(64, 64))), TEXT_ITEM, {"type": "response.create"})
        error = await h.transport.wait_for("error")
        await h.transport.wait_for("response.done")
    assert error["error"]["code"] == "unsupported_input"
    assert "vision" in error["error"]["message"]
    assert [c[0] for c in h.conversation.calls] == ["open", "add_text", "respond", "close"]


async def test_a_beta_client_sends_the_same_part():
    from realtime.protocol.names import Dialect

    settings = SessionSettings.for_engine(FakeEngine(vision=TINY_VISION), dialect=Dialect.BETA)
    async with seeing(settings=settings) as h:
        h.send(image_item(data_uri(picture(64, 64))))
        created = await h.transport.wait_for("conversation.item.created")
    assert created["item"]["content"][1] == {"type": "input_image", "detail": "auto"}
    assert h.calls("add_content") == [("add_content", created["item"]["id"], ("text", (56, 56, 3)))]
