"""The multi-stage omni engine: thinker -> talker -> token2wav, each streaming into the next."""
