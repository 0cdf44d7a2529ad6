"""Messages between the server and a media worker, over one socket pair per worker.

Each message is a length-prefixed pickle (:data:`HEADER`: 4-byte big-endian length). Both sides wrap their end in
asyncio streams: :meth:`Wire.send` writes without waiting (ordered; what does not fit the socket waits in the
transport's buffer) and :meth:`Wire.drain` waits while more than the stream's high-water mark is unsent, which is how a
producer is slowed down; :meth:`Wire.receive` returns the next message, or None once the other side has closed its
end (it exited or died). Only the two processes of one server read these pickles.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
from multiprocessing.connection import Connection

HEADER = struct.Struct("!I")
MAX_MESSAGE_BYTES = 64 << 20
"""A larger message means a corrupt stream: receive raises."""
HIGH_WATER = 4 << 20
"""Bytes buffered for sending above which :meth:`Wire.drain` waits."""


class WireError(Exception):
    """The stream is corrupt (a length beyond :data:`MAX_MESSAGE_BYTES`)."""


class Wire:
    """One end of a worker's socket pair, on the running event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        writer.transport.set_write_buffer_limits(high=HIGH_WATER)
        self.sent_bytes = 0
        self.received_bytes = 0

    @classmethod
    async def open(cls, connection: Connection) -> Wire:
        """Take over ``connection`` (one end of ``multiprocessing.Pipe(duplex=True)``: a Unix socket); it is closed,
        the wire owns a duplicate of its socket."""
        sock = socket.socket(fileno=os.dup(connection.fileno()))
        connection.close()
        sock.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        return cls(reader, writer)

    @property
    def closing(self) -> bool:
        return self._writer.is_closing()

    def send(self, message: object) -> None:
        """Queue ``message`` (ordered after every earlier one); a closed wire drops it (the other side is gone and
        its calls are being ended)."""
        if self._writer.is_closing():
            return
        body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._writer.write(HEADER.pack(len(body)) + body)
        self.sent_bytes += HEADER.size + len(body)

    async def drain(self) -> None:
        """Wait while the unsent bytes are over :data:`HIGH_WATER`; raises ``ConnectionError`` once the other side
        is gone."""
        await self._writer.drain()

    async def receive(self) -> object | None:
        try:
            header = await self._reader.readexactly(HEADER.size)
            (size,) = HEADER.unpack(header)
            if size > MAX_MESSAGE_BYTES:
                raise WireError(f"a media-worker message of {size} bytes: the stream is corrupt")
            body = await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.received_bytes += HEADER.size + size
        return pickle.loads(body)

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except ConnectionError:
            pass  # the other side went first: closed either way
