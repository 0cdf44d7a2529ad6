"""The engine core: one synchronous, single-threaded object that owns every model tensor, what it is asked
(:mod:`~pipeline.core.engine_core.commands`), how it is built, and the state of its conversations and responses."""
