"""Camera video in the engine: how much a conversation keeps, a spoken message's frames and their slots."""
