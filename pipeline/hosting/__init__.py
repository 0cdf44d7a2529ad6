"""Where the engine core runs: its thread (:mod:`~pipeline.hosting.loop`) or a child process
(:mod:`~pipeline.hosting.process`), and the picklable checkpoint recipes a child process loads from."""
