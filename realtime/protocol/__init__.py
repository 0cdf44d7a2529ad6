"""The OpenAI Realtime protocol, pure (no I/O): event names (GA + beta), error codes, client event
parsing (pydantic at the JSON edge → typed dataclasses) and server event builders.

Modules: :mod:`.names` (the GA ↔ beta naming table), :mod:`.codes` (wire error codes),
:mod:`.model` (typed protocol objects), :mod:`.wire` (pydantic models of client events),
:mod:`.validation` (pydantic errors → plain error messages, refusals of unimplemented features),
:mod:`.client` (``parse_client_event``), :mod:`.server` (``ServerEvents`` builders).

This package file imports nothing on purpose: ``realtime.errors`` imports :mod:`.codes`, and the
parsers import ``realtime.errors``.
"""
