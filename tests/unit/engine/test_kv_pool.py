"""KV slot pools and the pooled decoder: the decoder over a slot pool computes what transformers' own forward with
a DynamicCache computes, for chunked prefill and for a batch of rows at different positions in different slots."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import DynamicCache

from pipeline.kernels.decode_attention import attend_reference
from pipeline.runners.decode_graphs import BatchedDecode, HostRow, default_batch_sizes
from pipeline.runners.decoder import PooledDecoder
from pipeline.runners.kv_pool import KVPool, SlotAllocator
from tests.helpers.runners import thinker_runner
from tests.helpers.triton_check import TritonCheck

# -- slot allocation ---------------------------------------------------------------------------------


def test_slot_allocator_hands_out_each_slot_once_and_reuses_released_ones():
    slots = SlotAllocator(2)
    assert slots.acquire("a") == 0 and slots.acquire("b") == 1
    assert slots.acquire("c") is None, "full: no eviction on its own"
    assert slots.acquire("a") == 0, "an owner keeps its slot"
    assert slots.lru_owners() == ["b", "a"], "acquire marks the owner most recently used"
    slots.release("b")
    slots.release("b")  # idempotent
    assert slots.acquire("c") == 1 and slots.used == 2


def test_slot_allocator_rejects_an_empty_pool():
    with pytest.raises(ValueError):
        SlotAllocator(0)


def test_kv_pool_has_a_scratch_row_past_the_slots():
    pool = KVPool(layers=3, slots=4, max_len=16, kv_heads=2, head_dim=8, dtype=torch.float32, device="cpu")
    assert len(pool.keys) == len(pool.values) == 3
    assert pool.keys[0].shape == (5, 16, 2, 8) and pool.scratch_slot == 4
    assert pool.nbytes == 2 * 3 * 5 * 16 * 2 * 8 * 4


def test_default_batch_sizes_cover_every_count_up_to_the_pool():
    assert default_batch_sizes(1) == (1,)
    assert default_batch_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert default_batch_sizes(64)[-1] == 64


# -- the pooled decoder against transformers --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bodies(tiny_model_dir):
    from pipeline.models.common.hf_parts import thinker_text_model
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir)
    return {"thinker": thinker_text_model(ckpt.thinker), "talker": ckpt.talker.model}


def hf_hidden(body, x: torch.Tensor, cache: DynamicCache, start: int) -> torch.Tensor:
    positions = torch.arange(start, start + x.shape[0]).view(1, 1, -1).expand(3, 1, -1)
    # newer transformers name it ``cache`` (``past_key_values`` warns, and goes in 5.40); 5.17 takes only the old name
    keyword = "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"
    out = body(inputs_embeds=x.unsqueeze(0), position_ids=positions, use_cache=True, **{keyword: cache})
    return out.last_hidden_state[0]


@pytest.mark.parametrize("stage", ["thinker", "talker"])
@torch.inference_mode()
def test_pooled_decoder_matches_transformers_for_chunked_prefill_and_batched_decode(tiny_bodies, stage):
    body = tiny_bodies[stage]
    hidden = body.config.hidden_size
    torch.manual_seed(0)
    prompts = [torch.randn(n, hidden) for n in (9, 4, 13)]
    steps = [torch.randn(3, hidden) for _ in prompts]
    dec = PooledDecoder(body, slots=4, max_len=32, dtype=torch.float32, device=torch.device("cpu"))
    slots = [3, 0, 1]  # rows in slots out of order
    expected = []
    for slot, prompt, step in zip(slots, prompts, steps):
        cache = DynamicCache(config=body.config)
        ref_prompt = hf_hidden(body, prompt, cache, 0)
        half = prompt.shape[0] // 2
        ours = torch.cat([dec.prefill(slot, prompt[:half], 0), dec.prefill(slot, prompt[half:], half)])  # two chunks
        torch.testing.assert_close(ours, ref_prompt, rtol=1e-5, atol=1e-5)
        expected.append([hf_hidden(body, step[i : i + 1], cache, prompt.shape[0] + i)[0] for i in range(3)])
    for i in range(3):  # three batched steps, every row at its own position
        positions = torch.tensor([p.shape[0] + i for p in prompts])
        out = dec.decode(torch.stack([s[i] for s in steps]), torch.tensor(slots), positions)
        for row in range(3):
            torch.testing.assert_close(out[row], expected[row][i], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_batched_decode_on_the_cpu_runs_the_step_eagerly(tiny_bodies):
    body = tiny_bodies["thinker"]
    dec = PooledDecoder(body, slots=2, max_len=8, dtype=torch.float32, device=torch.device("cpu"))
    dec.prefill(0, torch.randn(2, body.config.hidden_size), 0)
    calls = []

    def step(slots, positions, flags, x, *, graph_safe):
        calls.append((graph_safe, flags.dtype, flags.tolist()))
        return (dec.decode(x, slots, positions, graph_safe=graph_safe),)

    batched = BatchedDecode(
        step,
        pool=dec.pool,
        device=torch.device("cpu"),
        cuda_graphs=True,
        batch_sizes=(),
        host_rows=(HostRow(torch.bool, 0),),
        device_rows=lambda b: (torch.zeros(b, body.config.hidden_size),),
    )
    batched.capture()  # nothing to capture without CUDA
    (out,) = batched([0], [2], ([True],), torch.randn(1, body.config.hidden_size))
    assert out.shape == (1, body.config.hidden_size)
    assert calls == [(False, torch.bool, [True])] and batched.captured == () and batched.eager_steps == 1
    with pytest.raises(ValueError, match="host row inputs"):
        batched([0], [2], (), torch.randn(1, body.config.hidden_size))


# -- the Triton attention kernel ----------------------------------------------------------------------


TRITON_CHECK = """
import torch
from pipeline.kernels.decode_attention import attend_reference, attend_triton
torch.manual_seed(0)
for hq, hkv, d in ((8, 2, 32), (6, 2, 64), (4, 4, 16)):
    keys, values = torch.randn(5, 100, hkv, d), torch.randn(5, 100, hkv, d)
    q = torch.randn(3, hq, d)
    slots, lengths = torch.tensor([4, 0, 2]), torch.tensor([1, 70, 33])
    ref = attend_reference(q, keys, values, slots, lengths, d ** -0.5)
    # one program per row and head; then each row's positions shared by 2-16 programs (shares of whole blocks, so
    # the 1-position row and the 33-position row leave shares empty) and combined
    for splits in (1, 2, 4, 16):
        out = attend_triton(q, keys, values, slots, lengths, d ** -0.5, block_n=16, splits=splits)
        assert (ref - out).abs().max() < 1e-5, (hq, hkv, d, splits, (ref - out).abs().max())
print("ok")
"""


ATTENTION = TritonCheck(TRITON_CHECK, timeout_s=300, interpreter_only=True)  # with CUDA: the GPU test below


@pytest.mark.background(ATTENTION)
def test_triton_decode_attention_matches_the_reference_in_the_interpreter():
    """The kernel's arithmetic (GQA head mapping, per-row slot and length, online softmax over several blocks)
    checked on the CPU through Triton's interpreter; the GPU test below runs it compiled."""
    ATTENTION.assert_ok()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_decode_attention_on_the_gpu():
    from pipeline.kernels.decode_attention import attend_triton

    torch.manual_seed(0)
    keys = torch.randn(9, 700, 4, 128, device="cuda", dtype=torch.bfloat16)
    values = torch.randn_like(keys)
    q = torch.randn(5, 28, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.tensor([8, 0, 3, 3, 1], device="cuda")
    lengths = torch.tensor([1, 700, 64, 65, 333], device="cuda")
    ref = attend_reference(q.float(), keys.float(), values.float(), slots, lengths, 128**-0.5)
    for splits in (None, 1, 8):  # the automatic choice, one pass, split 8 ways
        out = attend_triton(q, keys, values, slots, lengths, 128**-0.5, splits=splits)
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_attention_splits_spread_few_rows_over_the_sms():
    """Few rows: each row's positions are shared by up to 16 programs, keeping about two programs per SM (132 SMs
    assumed off the GPU); enough rows already fill the GPU and run the single-pass kernel."""
    from pipeline.kernels.decode_attention import attention_splits

    cpu = torch.device("cpu")
    assert attention_splits(1, 12, cpu) == 16  # the 7B talker at batch 1: 192 programs
    assert attention_splits(1, 28, cpu) == 8  # the 7B thinker at batch 1: 224 programs
    assert attention_splits(4, 28, cpu) == 2
    assert attention_splits(16, 12, cpu) == 1 and attention_splits(64, 28, cpu) == 1
    assert attention_splits(1, 1, cpu, max_splits=4) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_captured_decode_steps_match_eager_ones_on_the_gpu(tiny_model_dir):
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir, devices={"thinker": "cuda"}, dtypes={"thinker": torch.float32})
    runner = thinker_runner(ckpt, device=torch.device("cuda"), dtype=torch.float32, kv_slots=4, max_len=64)
    runner.batched.capture()
    assert runner.batched.captured == (1, 2, 4)
    # the step's graphs share one capture stream of their own (one cuBLAS workspace, never the default stream's)
    streams = {call.capture_stream for call in runner.batched._graphs.values()}
    assert streams == {runner.batched.capture_stream} and runner.batched.capture_stream != torch.cuda.current_stream()
    hidden = ckpt.thinker.config.text_config.hidden_size
    for slot, n in ((0, 7), (2, 12), (3, 3)):
        runner.prefill(torch.randn(n, hidden, device="cuda"), slot, 0)
    graphed = runner.decode([5, 6, 7], [0, 2, 3], [7, 12, 3])  # a batch of 3 replays the graph of 4
    graphed = [t.clone() for t in (graphed.hidden, graphed.logits)]
    # eager recomputation: writes the same keys/values again at the same positions
    eager = runner._decode_fn(
        torch.tensor([0, 2, 3], device="cuda"),
        torch.tensor([7, 12, 3], device="cuda"),
        torch.tensor([5, 6, 7], device="cuda"),
        graph_safe=False,
    )
    torch.testing.assert_close(graphed[0], eager[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(graphed[1], eager[2], rtol=1e-4, atol=1e-4)
    assert runner.batched.replays == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_captured_prefills_match_eager_ones_on_the_gpu(tiny_model_dir):
    """A prefill span as rows of a captured step (padded to the next captured size) gives the eager prefill's hidden
    states and writes the same keys and values, causally, at any start; a span longer than every graph runs eagerly."""
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir, devices={"thinker": "cuda"}, dtypes={"thinker": torch.float32})
    graphed = thinker_runner(ckpt, device=torch.device("cuda"), dtype=torch.float32, kv_slots=4, max_len=1024)
    eager = thinker_runner(
        ckpt, device=torch.device("cuda"), dtype=torch.float32, kv_slots=4, max_len=1024, cuda_graphs=False
    )
    graphed.capture()
    assert graphed.prefills.captured == (8, 16, 32, 64, 128, 256, 512) and not eager.prefills.fits(3)
    hidden = ckpt.thinker.config.text_config.hidden_size
    torch.manual_seed(0)
    for slot, start, n in ((1, 0, 5), (1, 5, 40), (2, 0, 300), (1, 45, 600)):
        x = torch.randn(n, hidden, device="cuda")
        want = eager.prefill(x, slot, start)
        got = graphed.prefill(x, slot, start)
        torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.last_logits, want.last_logits, rtol=1e-4, atol=1e-4)
    for layer in (0, len(graphed.decoder.layers) - 1):
        for pool in ("keys", "values"):
            got_kv, want_kv = getattr(graphed.pool, pool)[layer], getattr(eager.pool, pool)[layer]
            torch.testing.assert_close(got_kv[1, :645], want_kv[1, :645], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got_kv[2, :300], want_kv[2, :300], rtol=1e-4, atol=1e-4)
    assert graphed.prefills.replays == 3 and graphed.prefills.eager_steps == 0, "600 positions: the eager prefill"
