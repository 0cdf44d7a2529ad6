"""The output side: turns what the runners made into response events."""
