"""Named stage connectors. The YAML picks connectors by these names; nothing is imported from
paths written in configuration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.models.qwen2_5_omni import connectors as qwen2_5_omni


@dataclass(frozen=True)
class Connector:
    name: str
    source: str
    target: str
    fn: Callable


CONNECTORS: dict[str, Connector] = {
    c.name: c
    for c in (
        Connector("thinker_to_talker", "thinker", "talker", qwen2_5_omni.thinker_to_talker),
        Connector("talker_to_token2wav", "talker", "token2wav", qwen2_5_omni.talker_to_token2wav),
    )
}
