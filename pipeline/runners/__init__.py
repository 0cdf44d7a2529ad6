"""Runners: execute a step plan's work on the device (thinker, talker, audio encoder, token2wav worker)."""
