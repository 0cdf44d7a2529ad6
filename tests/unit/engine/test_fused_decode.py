"""The fused decode step (pipeline/kernels/fused_decode.py) computes what HF's layer code computes.

The Triton kernels run on the CPU through Triton's interpreter (a subprocess with ``TRITON_INTERPRET=1``, which
must be set before Triton is imported); on a GPU the compiled kernels are checked instead."""

from __future__ import annotations

import pytest
import torch

from pipeline.kernels.fused_decode import fusable
from pipeline.runners.decoder import PooledDecoder
from tests.helpers.runners import thinker_runner
from tests.helpers.triton_check import TritonCheck

# Both stages' bodies of the tiny checkpoint, fused and not: prefill (fused kernels around the same attention) and
# three batched decode steps with rows in different slots at different positions. float32 only, so the only
# differences are summation order: the interpreter truncates float32 -> bfloat16 casts where compiled Triton rounds
# to nearest, so the bfloat16 rounding is checked on the GPU (test_fused_kernels_round_as_eager_bf16_on_the_gpu).
FUSED_CHECK = """
import tempfile
from pathlib import Path
import torch
from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint
from pipeline.models.qwen2_5_omni.tiny import make_random_checkpoint
from pipeline.models.common.hf_parts import thinker_text_model
from pipeline.runners.decoder import PooledDecoder
from pipeline.kernels.fused_decode import add_rms_norm, silu_mul

folder = tempfile.TemporaryDirectory()  # the tiny checkpoint (as the tiny_model_dir fixture makes it), removed at exit
model_dir = make_random_checkpoint(Path(folder.name))
torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-5),):
    ckpt = load_checkpoint(model_dir, dtypes={"thinker": dtype, "talker": dtype})
    for body in (thinker_text_model(ckpt.thinker), ckpt.talker.model):
        hidden = body.config.hidden_size
        ref = PooledDecoder(body, slots=4, max_len=40, dtype=dtype, device=torch.device("cpu"))
        fused = PooledDecoder(body, slots=4, max_len=40, dtype=dtype, device=torch.device("cpu"), fuse=True)
        assert fused.fused is not None and ref.fused is None
        slots = [3, 0, 1]
        lengths = [9, 1, 17]
        for slot, n in zip(slots, lengths):
            x = torch.randn(n, hidden, dtype=dtype)
            half = n // 2  # two chunks: the second attends to the first's keys in the slot
            for chunk, start in ((x[:half], 0), (x[half:], half)):
                if len(chunk):
                    want = ref.prefill(slot, chunk, start)
                    torch.testing.assert_close(fused.prefill(slot, chunk, start), want, rtol=tol, atol=tol)
        for i in range(3):
            x = torch.randn(3, hidden, dtype=dtype)
            pos = torch.tensor([n + i for n in lengths])
            want = ref.decode(x, torch.tensor(slots), pos)
            got = fused.decode_fused(x, torch.tensor(slots), pos)
            torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
            for layer in range(len(ref.layers)):  # the keys/values written by the RoPE kernel
                for s, p in zip(slots, pos.tolist()):
                    for pool, ref_pool in ((fused.pool.keys, ref.pool.keys), (fused.pool.values, ref.pool.values)):
                        torch.testing.assert_close(pool[layer][s, p], ref_pool[layer][s, p], rtol=tol, atol=tol)
        # explicit 3-D rope positions (a picture's), apart from the cache indices: prefill and decode rows
        rope = torch.stack([torch.randint(0, 40, (6,)) for _ in range(3)])
        x = torch.randn(6, hidden, dtype=dtype)
        torch.testing.assert_close(fused.prefill(2, x, 0, rope), ref.prefill(2, x, 0, rope), rtol=tol, atol=tol)
        rows = torch.randn(2, hidden, dtype=dtype)
        slots2, pos2, rope2 = torch.tensor([2, 2]), torch.tensor([6, 7]), torch.tensor([[3, 30], [5, 1], [39, 0]])
        want = ref.decode(rows, slots2, pos2, rope2)
        torch.testing.assert_close(fused.decode_fused(rows, slots2, pos2, rope2), want, rtol=tol, atol=tol)
        layer = body.layers[0]
        h = torch.randn(5, hidden, dtype=dtype)
        d = torch.randn(5, hidden, dtype=dtype)
        normed, summed = add_rms_norm(d, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, h)
        assert torch.equal(summed, h + d)
        torch.testing.assert_close(normed, layer.input_layernorm(h + d), rtol=1e-6, atol=1e-6)
        gu = torch.randn(5, 2 * layer.mlp.gate_proj.out_features, dtype=dtype)
        g, u = gu.chunk(2, dim=-1)
        torch.testing.assert_close(silu_mul(gu), layer.mlp.act_fn(g) * u, rtol=1e-6, atol=1e-6)
print("ok")
"""


FUSED = TritonCheck(FUSED_CHECK, interpreter_only=True)  # with CUDA: test_fused_decode_on_the_gpu


@pytest.mark.background(FUSED)
def test_fused_decode_matches_hf_layers_in_the_triton_interpreter():
    FUSED.assert_ok()


@torch.inference_mode()
def test_fusing_keeps_the_hf_modules_working_on_shared_storage(tiny_model_dir):
    """Fusing re-points q/k/v and gate/up at views of one tensor: same values, no copy left behind."""
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir)
    body = ckpt.talker.model
    layer = body.layers[0]
    assert fusable(layer)
    before = [p.clone() for p in (layer.self_attn.q_proj.weight, layer.self_attn.v_proj.bias, layer.mlp.up_proj.weight)]
    dec = PooledDecoder(body, slots=1, max_len=8, dtype=torch.float32, device=torch.device("cpu"), fuse=True)
    after = (layer.self_attn.q_proj.weight, layer.self_attn.v_proj.bias, layer.mlp.up_proj.weight)
    for old, new in zip(before, after):
        assert torch.equal(old, new)
    fused = dec.fused[0]
    assert layer.self_attn.k_proj.weight.untyped_storage().data_ptr() == fused.qkv_weight.untyped_storage().data_ptr()
    assert layer.mlp.gate_proj.weight.untyped_storage().data_ptr() == fused.gate_up_weight.untyped_storage().data_ptr()


def test_layers_of_another_structure_are_left_unfused(tiny_model_dir):
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir)
    layer = ckpt.talker.model.layers[0]
    layer.mlp.act_fn = torch.nn.GELU()
    assert not fusable(layer)
    dec = PooledDecoder(
        ckpt.talker.model, slots=1, max_len=8, dtype=torch.float32, device=torch.device("cpu"), fuse=True
    )
    assert dec.fused is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_fused_decode_on_the_gpu(tiny_model_dir):
    """Compiled kernels, bf16, captured in the runner's graphs: the fused step against the unfused eager one."""
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    for fused_decode in (False, True):
        ckpt = load_checkpoint(tiny_model_dir, devices={"thinker": "cuda"}, dtypes={"thinker": torch.bfloat16})
        runner = thinker_runner(
            ckpt,
            device=torch.device("cuda"),
            dtype=torch.bfloat16,
            kv_slots=4,
            max_len=64,
            fused_decode=fused_decode,
        )
        assert (runner.decoder.fused is not None) == fused_decode
        runner.batched.capture()
        hidden = ckpt.thinker.config.text_config.hidden_size
        torch.manual_seed(0)
        for slot, n in ((0, 7), (2, 12), (3, 3)):
            runner.prefill(torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16), slot, 0)
        step = runner.decode([5, 6, 7], [0, 2, 3], [7, 12, 3])
        if not fused_decode:
            want = step.hidden.float().clone()
        else:
            torch.testing.assert_close(step.hidden.float(), want, rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_kernels_round_as_eager_bf16_on_the_gpu():
    """In bfloat16 each kernel rounds where HF's eager code rounds: the residual sum is exact, the rest within
    about an ulp (float32 sums in another order, a different exp, or the compiler's own float32 contractions can
    flip a rounding)."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniRMSNorm

    from pipeline.kernels.fused_decode import add_rms_norm, rope_and_store, silu_mul
    from pipeline.runners.decoder import _rotate_half

    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    norm = Qwen2_5OmniRMSNorm(3584, eps=1e-6).to(dev, bf)
    norm.weight.data.normal_()
    h, d = torch.randn(4, 3584, device=dev, dtype=bf), torch.randn(4, 3584, device=dev, dtype=bf)
    normed, summed = add_rms_norm(d, norm.weight, 1e-6, h)
    assert torch.equal(summed, h + d)
    want = norm(h + d).float()
    err = (normed.float() - want).abs().max().item()
    assert ((normed.float() - want).abs() <= want.abs() * 2**-7).all(), err  # bf16 keeps 8 significant bits
    gu = torch.randn(4, 2 * 18944, device=dev, dtype=bf)
    g, u = gu.chunk(2, dim=-1)
    eager = (torch.nn.functional.silu(g) * u).float()
    assert ((silu_mul(gu).float() - eager).abs() <= eager.abs() * 2**-7 + 1e-6).all()
    heads, kv_heads, dim = 28, 4, 128
    qkv = torch.randn(3, (heads + 2 * kv_heads) * dim, device=dev, dtype=bf)
    cos, sin = torch.randn(50, dim, device=dev, dtype=bf), torch.randn(50, dim, device=dev, dtype=bf)
    keys, values = (
        torch.zeros(5, 50, kv_heads, dim, device=dev, dtype=bf),
        torch.zeros(5, 50, kv_heads, dim, device=dev, dtype=bf),
    )
    slots, positions = torch.tensor([4, 0, 2], device=dev), torch.tensor([0, 49, 17], device=dev)
    q = rope_and_store(qkv, cos, sin, keys, values, slots, positions, heads=heads, kv_heads=kv_heads)
    q_ref, k_ref, v_ref = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    c, s_ = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    for got, x in ((q, q_ref.view(3, heads, dim)), (keys[slots, positions], k_ref.view(3, kv_heads, dim))):
        a, b = x * c, _rotate_half(x) * s_
        # one rounding flip in either product or the sum: an ulp of the larger magnitude involved
        bound = (a.float().abs() + b.float().abs()) * 2**-7 + 1e-6
        diff = (got.float() - (a + b).float()).abs()
        assert (diff <= bound).all(), (diff / bound).max().item()
    assert torch.equal(values[slots, positions], v_ref.view(3, kv_heads, dim))
