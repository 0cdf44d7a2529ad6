"""WebRTC media in worker processes: each call's peer connection (ICE, DTLS, SRTP, RTP, Opus both ways, microphone
resampling, the paced reply track) runs in one of a few child processes, so the media work of many calls spreads over
cores, while the sessions, turn detection and the engine stay in the server's process.

- :mod:`.messages`: what crosses between the server and a worker (typed dataclasses);
- :mod:`.wire`: how they cross (length-prefixed pickles on a socket pair, with asyncio flow control);
- :mod:`.worker`: the worker process (its own event loop and its calls' peer connections);
- :mod:`.pool`: the server's side of the workers (spawn, placement of calls, restart after a death).

The calls themselves (sessions, transports, lifecycle) are the server's, as for media in its own process: the proxy of
a call's media on a worker is :mod:`realtime.transports.webrtc.worker_media`.
"""
