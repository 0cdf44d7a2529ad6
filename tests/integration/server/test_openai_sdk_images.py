"""The official ``openai`` SDK's GA realtime client, unmodified, sends an ``input_image`` item over a real server on
loopback and gets a completed reply whose usage counts the picture's tokens; a bad picture is an ``error`` event and
the session carries on. Against the fake engine with a vision tower, and against each model family's tiny engine."""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator

import numpy as np
import pytest
from openai import AsyncOpenAI
from PIL import Image

from realtime.config import ServerConfig
from realtime.media.images import ImageLimits, fit
from realtime.server.app import create_app, serve_in_background
from tests.fakes import TINY_VISION, FakeEngine

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
API_KEY = "sdk-test-key"


async def until(connection, event_type: str, seen: list) -> object:
    """Read events (recorded in ``seen``) up to the first of ``event_type``; an error event fails."""
    async for event in connection:
        seen.append(event)
        assert event.type != "error", event
        if event.type == event_type:
            return event
    raise AssertionError(f"the connection closed before {event_type}")


def jpeg_uri(height: int = 240, width: int = 320) -> tuple[str, Image.Image]:
    """A test card (colour gradients and a bar) as a JPEG data URI, and the picture itself."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=-1).astype(np.uint8)
    pixels[:, width // 3 : width // 3 + 20] = 255
    picture = Image.fromarray(pixels)
    data = io.BytesIO()
    picture.save(data, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(data.getvalue()).decode(), picture


@pytest.fixture(params=["fake", "tiny_engine", "qwen3_engine"], ids=["fake", "qwen2_5", "qwen3"])
def engine(request):
    """The fake engine with a vision tower, and each family's tiny engine (their vision towers are real)."""
    if request.param == "fake":
        return FakeEngine(vision=TINY_VISION)
    engine = request.getfixturevalue(request.param)
    assert engine.vision is not None, f"{request.param} takes no pictures"
    return engine


@pytest.fixture
async def base_url(engine) -> AsyncIterator[str]:
    config = ServerConfig(port=0, api_key=API_KEY, webrtc=False)
    async with serve_in_background(create_app(config, engine=engine), config) as url:
        yield url


async def test_an_input_image_item_gets_a_completed_reply_with_image_tokens(base_url, engine):
    url, picture = jpeg_uri()
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=API_KEY)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": url, "detail": "low"},
                    {"type": "input_text", "text": "What is in this picture?"},
                ],
            }
        )
        added = await until(connection, "conversation.item.done", [])
        assert [part.type for part in added.item.content] == ["input_image", "input_text"]
        await connection.response.create(response={"output_modalities": ["text"], "max_output_tokens": 8})
        done = (await until(connection, "response.done", [])).response
    assert done.status in ("completed", "incomplete")  # incomplete: cut at max_output_tokens
    assert done.status == "completed" or done.status_details.reason == "max_output_tokens"
    seen = fit(picture, engine.vision, ImageLimits().low_detail_pixels).shape
    expected = engine.vision.tokens(seen[0], seen[1])
    assert done.usage.input_token_details.image_tokens == expected > 0


async def test_a_bad_picture_is_an_error_and_the_session_carries_on(base_url):
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=API_KEY)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        assert (await connection.recv()).type == "session.created"
        not_a_picture = "data:image/png;base64," + base64.b64encode(b"plain text, not a PNG").decode()
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": not_a_picture}]}
        )
        error = await connection.recv()
        assert error.type == "error" and error.error.code == "unsupported_image_format"
        assert error.error.param == "item.content.0.image_url"
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
        )
        await connection.response.create(response={"output_modalities": ["text"], "max_output_tokens": 4})
        done = (await until(connection, "response.done", [])).response
    assert done.status in ("completed", "incomplete")
    assert not done.usage.input_token_details.image_tokens
