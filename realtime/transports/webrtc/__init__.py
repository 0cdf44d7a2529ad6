"""WebRTC calls: one call path whatever carries the media.

- :mod:`.endpoint`: :class:`WebRTCCalls`, the server's endpoint (offer → answer, slots, refusals, session factory);
- :mod:`.call`: :class:`~.call.Call`, one call (session runner, media sink, reply tracking) and the
  :class:`~.call.CallMedia` interface its media implement;
- :mod:`.transport`: the call's :class:`realtime.runner.Transport` (data channel and microphone, gate, bounds);
- :mod:`.lifecycle`: serving an answered call and its teardown;
- :mod:`.in_process`: media in the server's process (an aiortc peer connection on its event loop);
- :mod:`.worker_media`: media on a media worker process (the proxy; the worker side is
  :mod:`realtime.transports.media_workers`), and :class:`WorkerCalls`, the endpoint with its media on workers.
"""

from realtime.transports.peer import IceHostAddress, announce_host_addresses
from realtime.transports.webrtc.call import CallStatus, EventObserver
from realtime.transports.webrtc.endpoint import WebRTCCalls, default_turn_detection
from realtime.transports.webrtc.errors import WebRTCUnavailable

__all__ = [
    "CallStatus",
    "EventObserver",
    "IceHostAddress",
    "WebRTCCalls",
    "WebRTCUnavailable",
    "announce_host_addresses",
    "default_turn_detection",
]
