"""How many conversations fit on one GPU: the capacity table of docs/engine.md ("How many conversations fit").

Computed by the engine's own rule (:func:`pipeline.runners.kv_sizing.plan_kv_pools`, what ``kv_slots: auto`` runs at
load) from the released models' shapes (``pipeline/models/qwen3_omni/released.py``, the Qwen2.5-Omni-7B preset of
``pipeline/models/qwen2_5_omni/tiny.py``) and the packaged stage configs (talker reply length, token2wav's batch,
``engine.kv_reserve_gib``, ``engine.kv_auto_max_slots``), in bfloat16, for each GPU's memory less
:data:`GPU_OVERHEAD` and the weights. ``tests/unit/engine/test_kv_sizing.py`` checks that the documentation holds
exactly this output.

    python scripts/kv_capacity.py
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import PACKAGED_STAGE_CONFIGS, StageGraphConfig, load_stage_config
from pipeline.errors import ConfigError
from pipeline.models.qwen2_5_omni.tiny import RELEASED_7B_PARAMETERS, Qwen25OmniRandomModelSpec
from pipeline.models.qwen3_omni import released
from pipeline.runners.kv_sizing import GIB, PoolRequest, SlotShape, plan_kv_pools, talker_slot_positions

MIB = 1 << 20
BF16, FLOAT32 = 2, 4
CONTEXTS = (4096, 8192, 32768)
"""``thinker.max_context_tokens`` of each column."""
GPU_OVERHEAD = 1 * GIB
"""What a GPU's memory loses before the weights load: the driver's reserved memory (nvidia-smi's total counts it) and
the CUDA context, kernels and cuBLAS workspaces of the engine's process."""
QWEN3_MEASURED_BF16_GIB = 65.7
"""Qwen3-Omni-30B-A3B's weights in bfloat16, measured with transformers' reference on an H100 (issue 44)."""


@dataclass(frozen=True)
class Gpu:
    name: str
    total: int
    """Bytes, as nvidia-smi shows the card's total."""


GPUS = (Gpu("H100 80 GB", 81559 * MIB), Gpu("H200 141 GB", 143771 * MIB))


@dataclass(frozen=True)
class Stage:
    """A decoder stage's KV geometry and the vocabulary rows it keeps per slot (its samplers' tables)."""

    layers: int
    kv_heads: int
    head_dim: int
    table_ids: int


@dataclass(frozen=True)
class Model:
    name: str
    family: str
    weights: int
    """Bytes on the GPU: bfloat16, token2wav float32 (as the packaged stage configs load it)."""
    weights_note: str
    thinker: Stage
    talker: Stage
    frames: bool
    """A frame talker (one position per frame of several codebooks)."""


def qwen3_omni() -> Model:
    text, talker = released.THINKER_TEXT, released.TALKER_TEXT
    code2wav = round(released.PARAMETERS_B["code2wav"] * 1e9)
    weights = round(QWEN3_MEASURED_BF16_GIB * GIB) + code2wav * (FLOAT32 - BF16)
    return Model(
        "Qwen3-Omni-30B-A3B",
        "qwen3_omni",
        weights,
        f"{QWEN3_MEASURED_BF16_GIB} GiB in bf16 as measured, code2wav's {released.PARAMETERS_B['code2wav']} B "
        "parameters in float32",
        Stage(text["num_hidden_layers"], text["num_key_value_heads"], text["head_dim"], text["vocab_size"]),
        Stage(
            talker["num_hidden_layers"],
            talker["num_key_value_heads"],
            talker["head_dim"],
            talker["vocab_size"] + released.CODE_PREDICTOR["vocab_size"],
        ),
        frames=True,
    )


def qwen2_5_omni() -> Model:
    spec, params = Qwen25OmniRandomModelSpec.qwen2_5_omni_7b(), RELEASED_7B_PARAMETERS
    weights = (params["total"] - params["token2wav"]) * BF16 + params["token2wav"] * FLOAT32
    return Model(
        "Qwen2.5-Omni-7B",
        "qwen2_5_omni",
        weights,
        f"{params['total'] / 1e9:.2f} B parameters, token2wav's {params['token2wav'] / 1e9:.2f} B in float32",
        Stage(
            spec.thinker_layers, spec.thinker_kv_heads, spec.thinker_hidden // spec.thinker_heads, spec.thinker_vocab
        ),
        Stage(spec.talker_layers, spec.talker_kv_heads, spec.talker_head_dim, spec.talker_vocab),
        frames=False,
    )


def requests(model: Model, cfg: StageGraphConfig, context: int) -> list[PoolRequest]:
    """Both stages' pools as the packaged config asks for them (``auto``), at ``context`` positions."""
    talker_positions = talker_slot_positions(context, cfg.talker.max_tokens or 0, frames=model.frames)
    return [
        PoolRequest("thinker", "cuda:0", _shape(model.thinker, context), None),
        PoolRequest("talker", "cuda:0", _shape(model.talker, talker_positions), None, limit=cfg.token2wav.max_batch),
    ]


def _shape(stage: Stage, positions: int) -> SlotShape:
    return SlotShape(stage.layers, stage.kv_heads, stage.head_dim, BF16, positions, table_bytes=stage.table_ids)


def conversations(model: Model, gpu: Gpu, context: int) -> tuple[int, int]:
    """(what ``kv_slots: auto`` gives the thinker, how many the memory alone holds); (0, 0) when not one fits."""
    cfg = load_stage_config(PACKAGED_STAGE_CONFIGS[model.family])
    free = gpu.total - GPU_OVERHEAD - model.weights
    reserve = round(cfg.engine.kv_reserve_gib * GIB)
    pools = requests(model, cfg, context)
    try:
        auto = plan_kv_pools(pools, free={"cuda:0": free}, reserve=reserve, max_slots=cfg.engine.kv_auto_max_slots)
        fit = plan_kv_pools(pools, free={"cuda:0": free}, reserve=reserve, max_slots=1 << 20)
    except ConfigError:
        return 0, 0
    return auto.slots("thinker"), fit.slots("thinker")


def table() -> str:
    """The Markdown table: a row per model and GPU, a column per context length."""
    head = " | ".join(f"{c} positions" for c in CONTEXTS)
    lines = [f"| model (weights on the GPU) | GPU | {head} |", "|---|---|" + "---:|" * len(CONTEXTS)]
    for model in (qwen3_omni(), qwen2_5_omni()):
        for gpu in GPUS:
            cells = []
            for context in CONTEXTS:
                auto, fit = conversations(model, gpu, context)
                cells.append(str(auto) if auto == fit else f"{auto} (memory: {fit})")
            lines.append(f"| {model.name} ({model.weights / GIB:.1f} GiB) | {gpu.name} | {' | '.join(cells)} |")
    notes = [f"- {m.name}: {m.weights / GIB:.1f} GiB = {m.weights_note}." for m in (qwen3_omni(), qwen2_5_omni())]
    return "\n".join([*lines, "", *notes])


if __name__ == "__main__":
    print(table())
