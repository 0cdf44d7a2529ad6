#!/usr/bin/env python
"""Write a random-weight Qwen2.5-Omni checkpoint in the Hugging Face layout.

    python scripts/make_tiny_model.py --out /tmp/tiny-omni              # ~5 MB, seconds
    python scripts/make_tiny_model.py --out /data/omni-7b-random --preset 7b --seed 1

The output loads with ``pipeline.models.qwen2_5_omni.checkpoint.load_checkpoint`` and with
``Qwen2_5OmniForConditionalGeneration.from_pretrained``; it is marked as random
(``omni_realtime_random.json``) so the server never presents it as an assistant. ``main(argv)`` is
the same entry point as ``omni-realtime make-tiny-model``.
"""

from __future__ import annotations

import os
import sys

# torch on shared CPU cores: one thread (must be set before torch is imported).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Run from a source checkout without installing: the repository root holds the `pipeline` package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.models.qwen2_5_omni.tiny import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    sys.exit(main())
