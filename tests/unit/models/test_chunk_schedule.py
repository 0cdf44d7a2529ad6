"""Chunk planner for streaming token2wav: validation, official schedule, and tiling/readiness properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from pipeline.models.qwen2_5_omni.chunk_schedule import ChunkingConfig, ChunkPlan, FrameRange, plan_next_chunk


def drain(
    cfg: ChunkingConfig, frames_done: int, codes: int, finished: bool, index: int, emitted: int | None = None
) -> list[ChunkPlan]:
    """Plan every chunk that is ready now, as a stream that steps greedily would (``emitted``: frames whose samples
    earlier chunks emitted, as the stream counts them)."""
    plans = []
    while plan := plan_next_chunk(
        cfg, frames_done=frames_done, codes_available=codes, finished=finished, index=index, emitted_frames=emitted
    ):
        plans.append(plan)
        frames_done, index, emitted = plan.frames.end, index + 1, plan.samples.end // cfg.samples_per_frame
    return plans


def test_official_schedule_is_expressible() -> None:
    cfg = ChunkingConfig(first_chunk_frames=72, dit_block_frames=24)
    assert cfg.first_audio_codes == 48  # the official "first chunk needs 48 codec tokens"
    plans = drain(cfg, 0, 200, True, 0)
    bounds = [(0, 72), (72, 144), (144, 216), (216, 288), (288, 360), (360, 400)]
    assert [(p.frames.start, p.frames.end) for p in plans] == bounds
    second = plans[1]
    assert (second.dit_context.start, second.dit_context.end) == (72 - 48, 144 + 24)
    assert (second.dit_codes.start, second.dit_codes.end) == (12, 84)
    assert (second.vocoder_frames.start, second.vocoder_frames.end) == (72 - 40, 144)
    # Re-run 40 frames, drop the first 20 frames of output: emit from 52 (the previous chunk held 52..72).
    assert (second.samples.start, second.samples.end) == (52 * 240, 124 * 240)
    assert plans[0].samples.end == 52 * 240 and plans[-1].samples.end == 400 * 240


def test_default_first_chunk_needs_fewer_codes_than_official() -> None:
    cfg = ChunkingConfig()
    assert (cfg.first_chunk_frames, cfg.chunk_frames, cfg.past_frames, cfg.future_frames) == (48, 72, 48, 24)
    assert cfg.first_audio_codes == 36
    assert plan_next_chunk(cfg, frames_done=0, codes_available=35, finished=False) is None
    first = plan_next_chunk(cfg, frames_done=0, codes_available=36, finished=False)
    assert first is not None and (first.frames.start, first.frames.end) == (0, 48)
    assert (first.dit_context.start, first.dit_context.end) == (0, 72) and not first.is_last


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"first_chunk_frames": 36, "dit_block_frames": 24}, "first_chunk_frames"),
        ({"chunk_frames": 50, "dit_block_frames": 24}, "chunk_frames"),
        ({"past_frames": 12, "dit_block_frames": 24}, "past_frames"),
        ({"future_frames": 3}, "future_frames"),  # not whole codec tokens
        ({"chunk_frames": 0}, "chunk_frames"),
        ({"vocoder_trim_frames": 41}, "vocoder_trim_frames"),
        ({"vocoder_overlap_frames": -1, "vocoder_trim_frames": 0}, "vocoder_overlap_frames"),
        ({"ode_steps": 1}, "ode_steps"),
        ({"guidance_scale": -0.5}, "guidance_scale"),
        ({"dit_block_frames": 0}, "dit_block_frames"),
    ],
)
def test_invalid_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ChunkingConfig(**kwargs)
    assert info.value.param == field
    assert field in str(info.value)


def test_finished_short_stream_is_one_last_chunk() -> None:
    cfg = ChunkingConfig()
    assert plan_next_chunk(cfg, frames_done=0, codes_available=5, finished=False) is None
    plan = plan_next_chunk(cfg, frames_done=0, codes_available=5, finished=True)
    assert plan is not None and plan.is_last
    assert (plan.frames.end, plan.samples.start, plan.samples.end) == (10, 0, 10 * 240)
    assert plan_next_chunk(cfg, frames_done=10, codes_available=5, finished=True) is None
    assert plan_next_chunk(cfg, frames_done=0, codes_available=0, finished=True) is None


def test_inconsistent_progress_is_rejected() -> None:
    with pytest.raises(ValueError):
        plan_next_chunk(ChunkingConfig(), frames_done=12, codes_available=5, finished=False)


@st.composite
def configs(draw) -> ChunkingConfig:
    fpc = draw(st.integers(1, 3))
    block = draw(st.one_of(st.none(), st.integers(1, 3).map(lambda k: k * fpc)))
    unit = block or fpc
    overlap = draw(st.integers(0, 12))
    future = unit * draw(st.integers(0, 3))
    return ChunkingConfig(
        first_chunk_frames=unit * draw(st.integers(1, 4)),
        chunk_frames=unit * draw(st.integers(1, 4)),
        past_frames=unit * draw(st.integers(0, 3)),
        future_frames=future,
        first_vocoder_lookahead_frames=draw(st.integers(0, future)),
        vocoder_overlap_frames=overlap,
        vocoder_trim_frames=draw(st.integers(0, overlap)),
        frames_per_code=fpc,
        samples_per_frame=draw(st.integers(1, 5)),
        dit_block_frames=block,
    )


def check_ready_plan(cfg: ChunkingConfig, plan: ChunkPlan, codes: int, finished: bool) -> None:
    available = codes * cfg.frames_per_code
    hop = cfg.samples_per_frame
    frames, context, vocoder, samples = plan.frames, plan.dit_context, plan.vocoder_frames, plan.samples
    assert len(frames) > 0
    assert 0 <= context.start <= frames.start < frames.end <= context.end <= available  # only arrived codes
    assert plan.dit_codes.end <= codes
    assert plan.dit_codes.start * cfg.frames_per_code == context.start
    assert plan.dit_codes.end * cfg.frames_per_code == context.end
    assert context.start == max(0, frames.start - cfg.past_frames)
    if not finished:  # before the end a chunk always gets its full look-ahead, and is never last
        assert context.end == frames.end + cfg.future_frames and frames.end < available and not plan.is_last
    lookahead = vocoder.end - frames.end  # provisional right context: a first chunk's only
    assert lookahead == 0 or (plan.index == 0 and not plan.is_last and vocoder.end <= context.end)
    assert lookahead <= cfg.first_vocoder_lookahead_frames
    assert vocoder.start == max(0, frames.start - cfg.vocoder_overlap_frames)
    assert vocoder.start * hop <= samples.start <= samples.end <= frames.end * hop
    if not plan.is_last:  # held-back frames wait for right context
        assert samples.end <= max(samples.start // hop, frames.end - max(0, cfg.hold_frames - lookahead)) * hop


@settings(max_examples=300, deadline=None)
@given(cfg=configs(), arrivals=st.lists(st.integers(0, 9), max_size=25), step_every=st.integers(1, 3))
def test_chunks_tile_the_utterance_and_never_need_missing_codes(cfg, arrivals, step_every) -> None:
    codes, frames_done, emitted, plans = 0, 0, 0, []
    for tick, count in enumerate(arrivals):
        codes += count
        if tick % step_every:
            continue  # the engine may fall behind; plans must stay valid when it catches up
        for plan in drain(cfg, frames_done, codes, False, len(plans), emitted):
            check_ready_plan(cfg, plan, codes, finished=False)
            plans.append(plan)
            frames_done, emitted = plan.frames.end, plan.samples.end // cfg.samples_per_frame
    for plan in drain(cfg, frames_done, codes, True, len(plans), emitted):
        check_ready_plan(cfg, plan, codes, finished=True)
        plans.append(plan)

    total = codes * cfg.frames_per_code
    assert [p.index for p in plans] == list(range(len(plans)))
    frame_bounds = [0] + [p.frames.end for p in plans]
    assert [p.frames.start for p in plans] == frame_bounds[:-1] and frame_bounds[-1] == total
    sample_bounds = [0] + [p.samples.end for p in plans]
    assert [p.samples.start for p in plans] == sample_bounds[:-1]
    assert sample_bounds[-1] == total * cfg.samples_per_frame
    assert [p.is_last for p in plans] == [False] * (len(plans) - 1) + [True] * bool(plans)


@settings(max_examples=200, deadline=None)
@given(cfg=configs())
def test_first_chunk_ready_exactly_at_first_audio_codes(cfg) -> None:
    need = cfg.first_audio_codes
    assert plan_next_chunk(cfg, frames_done=0, codes_available=need - 1, finished=False) is None
    plan = plan_next_chunk(cfg, frames_done=0, codes_available=need, finished=False)
    assert plan is not None and plan.frames.end == cfg.first_chunk_frames


@settings(max_examples=200, deadline=None)
@given(cfg=configs(), index=st.integers(0, 6))
def test_every_chunk_ready_exactly_at_codes_needed(cfg, index) -> None:
    frames_done = sum(cfg.chunk_size(i) for i in range(index))  # where chunk ``index`` starts in a stream
    need = cfg.codes_needed(index, frames_done=frames_done)
    assert plan_next_chunk(cfg, frames_done=frames_done, codes_available=need - 1, finished=False, index=index) is None
    plan = plan_next_chunk(cfg, frames_done=frames_done, codes_available=need, finished=False, index=index)
    assert plan is not None and plan.frames == FrameRange(frames_done, frames_done + cfg.chunk_size(index))


def starvation_ms(cfg: ChunkingConfig, total_codes: int, speed: float) -> float:
    """Longest gap (ms) a player starting at the first chunk would hear, with codec tokens arriving at
    ``speed`` x real time (50 tokens/s at 1x) and synthesis itself taking no time."""
    frames_done, index, emitted, start, worst, n = 0, 0, 0, None, 0.0, 0
    while True:
        plan = None
        while plan is None and n < total_codes:
            n += 1
            plan = plan_next_chunk(cfg, frames_done=frames_done, codes_available=n, finished=False, index=index)
        if plan is None:
            plan = plan_next_chunk(
                cfg, frames_done=frames_done, codes_available=total_codes, finished=True, index=index
            )
            if plan is None:
                return worst
        ready = n / (50 * speed)
        if start is None:
            start = ready
        worst = max(worst, (ready - (start + emitted / 24000)) * 1000)
        emitted += len(plan.samples)
        frames_done, index = plan.frames.end, index + 1
        if plan.is_last:
            return worst


def test_packaged_schedule_never_starves_a_player_at_one_and_a_half_real_time():
    from pipeline.config import load_stage_config

    cfg = ChunkingConfig(**load_stage_config().token2wav.settings.chunking, dit_block_frames=24)
    assert cfg.first_audio_codes == 36
    for speed in (1.5, 2.0, 4.0):
        assert starvation_ms(cfg, 500, speed) == 0.0, speed
    # without the ramp the same first chunk starves the player at 1.5x: the check can fail
    no_ramp = ChunkingConfig(first_chunk_frames=48, chunk_frames=72, dit_block_frames=24)
    assert starvation_ms(no_ramp, 500, 1.5) > 100


def test_ramp_sizes_are_used_in_order_then_the_steady_size():
    cfg = ChunkingConfig(first_chunk_frames=48, ramp_frames=[24, 48], chunk_frames=72, dit_block_frames=24)
    assert cfg.ramp_frames == (24, 48)
    assert [cfg.chunk_size(i) for i in range(5)] == [48, 24, 48, 72, 72]
    sizes, frames_done, index = [], 0, 0
    while plan := plan_next_chunk(cfg, frames_done=frames_done, codes_available=200, finished=True, index=index):
        sizes.append(len(plan.frames))
        frames_done, index = plan.frames.end, index + 1
    assert sizes[:4] == [48, 24, 48, 72] and sum(sizes) == 400


def test_ramp_sizes_are_validated():
    with pytest.raises(ConfigError, match="ramp_frames"):
        ChunkingConfig(ramp_frames=(25,))
    with pytest.raises(ConfigError, match="ramp_frames"):
        ChunkingConfig(ramp_frames=(48,), dit_block_frames=36)
