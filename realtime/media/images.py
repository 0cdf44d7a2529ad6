"""Pictures from clients: ``input_image`` data URIs → uint8 RGB arrays the engine takes.

:func:`decode_item` runs before the session sees a message with pictures (:mod:`realtime.runner`):

- :func:`parse_data_uri`: the ``image_url`` must be ``data:image/png;base64,…`` or ``data:image/jpeg;base64,…``
  (an ``http(s)`` URL is refused: the server fetches nothing) with valid base64 of at most
  :attr:`ImageLimits.max_bytes` bytes;
- :func:`decode_image` (in a worker thread): PIL reads the header first, so a picture over
  :attr:`ImageLimits.max_pixels` is refused before it is decompressed; then it decodes, converts to RGB and
  downscales to the ``detail`` level's pixel budget (:meth:`ImageLimits.budget`) on the engine's own grid
  (:meth:`pipeline.api.VisionInfo.resized`), so the engine keeps the picture as it receives it.

Every refusal is a :class:`realtime.errors.RealtimeError` with one of the codes named here (or the engine's
``UnsupportedInputError`` for a model that cannot see); the session carries on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image

from pipeline.api import VisionInfo
from pipeline.errors import UnsupportedInputError
from realtime.errors import RealtimeError
from realtime.protocol.client import ItemCreate
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import ContentPart, Detail, ImagePart, NewItem
from realtime.protocol.names import ContentType

MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG"}
"""Media types an ``input_image`` data URI may have, with the PIL format its bytes must be in."""

SIGNATURES = {"PNG": b"\x89PNG\r\n\x1a\n", "JPEG": b"\xff\xd8\xff"}
"""The first bytes of every file of each format: data without them is not a picture of that format; data with them
that PIL cannot read is a corrupt picture."""


@dataclass(frozen=True)
class ImageLimits:
    """What a client's picture may be, and how large the model sees it. Pixel budgets are upper bounds on
    height x width after the server's downscale; the engine's vision tower spends one thinker position per 28 x 28
    pixels (Qwen2.5-Omni), so 200 704 pixels are at most 256 positions."""

    max_bytes: int = 5 * 1024 * 1024
    """Largest encoded picture (the bytes of the data URI's payload, after base64)."""
    max_pixels: int = 4096 * 4096
    """Largest decoded picture (height x width), checked from its header before decoding."""
    low_detail_pixels: int = 256 * 28 * 28
    """``detail: low``: downscaled to at most this many pixels (256 positions)."""
    high_detail_pixels: int = 1280 * 28 * 28
    """``detail: high`` and ``auto``: at most this many pixels (1280 positions); never more than the checkpoint's
    own ``max_pixels``."""

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_pixels", "low_detail_pixels", "high_detail_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"image limit {name} must be >= 1, got {getattr(self, name)}")

    def budget(self, detail: Detail) -> int:
        return self.low_detail_pixels if detail is Detail.LOW else self.high_detail_pixels


@dataclass(frozen=True, eq=False)
class EncodedImage:
    """A validated data URI's payload: ``data`` in ``format`` (``PNG`` / ``JPEG``), seen at ``detail``."""

    data: bytes
    format: str
    detail: Detail = Detail.AUTO


def image_error(message: str, code: ErrorCode, param: str | None) -> RealtimeError:
    return RealtimeError(message, code=code, param=param)


def parse_data_uri(url: str, detail: Detail, limits: ImageLimits, *, param: str) -> EncodedImage:
    """The picture in an ``image_url``; raises :class:`RealtimeError` (``unsupported_value`` for a URL the server
    would have to fetch, ``invalid_image_url``, ``unsupported_image_format``, ``image_too_large``)."""
    head, comma, payload = url.partition(",")
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0].lower() if ":" in url[:16] else ""
        if scheme in ("http", "https"):
            raise image_error(
                "image URLs are not fetched by this server: send the picture inline as a data URI "
                "('data:image/jpeg;base64,...' or 'data:image/png;base64,...')",
                ErrorCode.UNSUPPORTED_VALUE,
                param,
            )
        raise image_error(
            "'image_url' must be a data URI: 'data:image/jpeg;base64,...' or 'data:image/png;base64,...'",
            ErrorCode.INVALID_IMAGE_URL,
            param,
        )
    media_type, _, encoding = head[len("data:") :].partition(";")
    if not comma or encoding.lower() != "base64":
        raise image_error(
            "'image_url' must be a base64 data URI ('data:<media type>;base64,<data>')",
            ErrorCode.INVALID_IMAGE_URL,
            param,
        )
    fmt = MEDIA_TYPES.get(media_type.lower())
    if fmt is None:
        raise image_error(
            f"media type {media_type!r} is not supported: send image/png or image/jpeg",
            ErrorCode.UNSUPPORTED_IMAGE_FORMAT,
            param,
        )
    if len(payload) > (limits.max_bytes + 2) // 3 * 4 + 4:
        raise _too_large_bytes(len(payload) * 3 // 4, limits, param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise image_error(f"'image_url' data is not valid base64: {exc}", ErrorCode.INVALID_IMAGE_URL, param) from None
    if len(data) > limits.max_bytes:
        raise _too_large_bytes(len(data), limits, param)
    if not data:
        raise image_error("'image_url' holds no picture (zero bytes)", ErrorCode.INVALID_IMAGE, param)
    return EncodedImage(data, fmt, detail)


def _too_large_bytes(size: int, limits: ImageLimits, param: str) -> RealtimeError:
    return image_error(
        f"the picture is {size} bytes; at most {limits.max_bytes} are accepted", ErrorCode.IMAGE_TOO_LARGE, param
    )


def decode_image(image: EncodedImage, vision: VisionInfo, limits: ImageLimits, *, param: str) -> np.ndarray:
    """``image`` as uint8 RGB ``(H, W, 3)``, downscaled to its detail's pixel budget on the engine's grid. Blocking
    (PIL): call it in a worker thread. Raises :class:`RealtimeError` (``unsupported_image_format`` when the bytes
    are not the data URI's format, ``image_too_large``, ``invalid_image`` for a corrupt or empty picture)."""
    if not image.data.startswith(SIGNATURES[image.format]):
        raise image_error(f"the data is not a {image.format} picture", ErrorCode.UNSUPPORTED_IMAGE_FORMAT, param)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            picture = Image.open(io.BytesIO(image.data), formats=[image.format])
        except (OSError, ValueError, SyntaxError) as exc:  # UnidentifiedImageError too
            raise image_error(f"the picture cannot be read: {exc}", ErrorCode.INVALID_IMAGE, param) from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise image_error("the picture is too large to decode", ErrorCode.IMAGE_TOO_LARGE, param) from None
        width, height = picture.size
        if width < 1 or height < 1:
            raise image_error(f"the picture is {width}x{height}: it has no pixels", ErrorCode.INVALID_IMAGE, param)
        if width * height > limits.max_pixels:
            raise image_error(
                f"the picture is {width}x{height} ({width * height} pixels); at most {limits.max_pixels} are accepted",
                ErrorCode.IMAGE_TOO_LARGE,
                param,
            )
        try:
            rgb = picture.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombWarning) as exc:
            raise image_error(f"the picture is corrupt: {exc}", ErrorCode.INVALID_IMAGE, param) from None
    return fit(rgb, vision, limits.budget(image.detail))


def fit(picture: Image.Image, vision: VisionInfo, budget: int) -> np.ndarray:
    """An RGB picture resized to what the engine makes of it under a pixel ``budget`` (at most the checkpoint's
    ``max_pixels``): ``vision.resized`` with that budget, bicubic, as uint8 ``(H, W, 3)``."""
    capped = dataclasses.replace(vision, max_pixels=min(budget, vision.max_pixels))
    height, width = capped.resized(picture.height, picture.width)
    if (height, width) != (picture.height, picture.width):
        picture = picture.resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(picture, dtype=np.uint8)


async def decode_item(event: ItemCreate, vision: VisionInfo | None, limits: ImageLimits) -> ItemCreate:
    """``event`` with every picture of its message decoded (:class:`ImagePart` ``pixels`` set), decoded one after
    the other in a worker thread. Raises ``UnsupportedInputError`` when the engine cannot see (``vision`` None),
    :class:`RealtimeError` for the first bad picture (its ``param`` names the content part)."""
    if vision is None:
        raise UnsupportedInputError(
            "this model has no vision tower: it cannot take pictures ('input_image' parts)", param="item.content"
        )
    parts: list[str | ImagePart] = []
    for i, part in enumerate(event.item.parts):
        if isinstance(part, ImagePart):
            param = f"item.content.{i}.image_url"
            encoded = parse_data_uri(part.url, part.detail, limits, param=param)
            pixels = await asyncio.to_thread(decode_image, encoded, vision, limits, param=param)
            part = dataclasses.replace(part, pixels=pixels)
        parts.append(part)
    return dataclasses.replace(event, item=dataclasses.replace(event.item, parts=tuple(parts)))


def engine_parts(item: NewItem) -> tuple[str | np.ndarray, ...]:
    """A decoded picture message's parts as :meth:`pipeline.api.ConversationHandle.add_content` takes them."""
    parts: list[str | np.ndarray] = []
    for part in item.parts:
        if isinstance(part, ImagePart):
            assert part.pixels is not None, "pictures are decoded (decode_item) before the session handles the item"
            parts.append(part.pixels)
        else:
            parts.append(part)
    return tuple(parts)


def mirror_parts(item: NewItem) -> list[ContentPart]:
    """The session's record of a picture message: its text parts, and its pictures by ``detail`` only."""
    return [
        ContentPart(ContentType.INPUT_IMAGE, detail=part.detail.value)
        if isinstance(part, ImagePart)
        else ContentPart(ContentType.INPUT_TEXT, text=part)
        for part in item.parts
    ]
