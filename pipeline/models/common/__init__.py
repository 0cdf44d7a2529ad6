"""Pieces several model families share (Qwen's ChatML prompt layout and its function-calling format, ...); a family
imports them, a generic engine module never needs to."""
