"""Profile one 1-user reply with more labels than scripts/profile_steps.py (run from the repository root), then
print each step's labels, host waits and GPU kernels: ``python <this> audio --model random:7b --device cuda --users 1``,
then ``python <this> analyse /tmp/profile_steps_1.json``. ``audio``: the reply answers a spoken question committed
right before it (as the server does) instead of a text prompt."""
import json
import sys


sys.path.insert(0, "scripts")
import profile_steps as ps  # noqa: E402

EXTRA = ["_talker_prefill", "_run_prefills", "encode_audio", "_collect_token2wav", "_accept_sampled",
         "_token2wav_job", "_background_talker_prefill", "_plan_background_prefills", "_thinker_decode",
         "_talker_decode", "_decode_overlapped", "_talker_rows", "_step_response", "_emit_audio"]
orig = ps.instrument


def instrument(core):
    orig(core)
    labelled = ps.labelled
    for name in EXTRA:
        setattr(core, name, labelled("core." + name, getattr(core, name)))
    core.token2wav.start = labelled("t2w.start", core.token2wav.start)
    core.thinker.embed = labelled("thinker.embed", core.thinker.embed)
    from pipeline.conversation_state import ConversationState
    ConversationState.talker_prompt = labelled("conv.talker_prompt", ConversationState.talker_prompt)
    core.code_sampler.reset = labelled("code_sampler.reset", core.code_sampler.reset)
    if core.t2w_worker is not None:
        core.t2w_worker.submit = labelled("worker.submit", core.t2w_worker.submit)


ps.instrument = instrument


def analyse(path, limit=60):
    tr = json.load(open(path))
    ev = [e for e in tr["traceEvents"] if e.get("ph") == "X"]
    ann = [e for e in ev if e.get("cat") == "user_annotation"]
    steps = sorted((e for e in ann if e["name"] == "engine.step" and e["dur"] > 300), key=lambda e: e["ts"])
    kernels = sorted((e for e in ev if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    syncs = [e for e in ev if e.get("cat") == "cuda_runtime" and ("Synchronize" in e["name"] or "Memcpy" in e["name"])]
    t0 = steps[0]["ts"]
    for s in steps[:limit]:
        a, b = s["ts"], s["ts"] + s["dur"]
        print(f"STEP at {(a - t0) / 1000:8.2f} ms dur {s['dur'] / 1000:6.2f}")
        for lab in sorted((e for e in ann if a <= e["ts"] < b and e["name"] != "engine.step"), key=lambda e: e["ts"]):
            print(f"   {(lab['ts'] - a) / 1000:6.2f} +{lab['dur'] / 1000:6.2f} {lab['name']}")
        for sy in sorted((e for e in syncs if a <= e["ts"] < b and e["dur"] > 200), key=lambda e: e["ts"]):
            print(f"   {(sy['ts'] - a) / 1000:6.2f} +{sy['dur'] / 1000:6.2f} [{sy['name']}]")
        inside = [k for k in kernels if k["ts"] < b + 20000 and k["ts"] + k["dur"] > a]
        groups = {}
        for k in inside:
            if k["ts"] >= b:
                continue
            g = groups.setdefault((k.get("args", {}).get("stream"), k["name"][:40]), [0, 0.0, k["ts"], 0])
            g[0] += 1
            g[1] += k["dur"]
            g[3] = k["ts"] + k["dur"]
        for (stream, name), (n, dur, first, last) in sorted(groups.items(), key=lambda kv: kv[1][2])[:14]:
            print(f"   k s{stream} {(first - a) / 1000:6.2f}..{(last - a) / 1000:6.2f} n={n:4d} {dur / 1000:6.2f} ms {name}")


def _main():
    if sys.argv[1] == "audio":
        ps.burst = audio_burst
        sys.argv.pop(1)
    if sys.argv[1] == "analyse":
        analyse(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 60)
    else:
        sys.exit(ps.main(sys.argv[1:]))



async def audio_burst(engine, users, asked=None):
    """As profile_steps.burst, but each user speaks a fixture (16 kHz), appended at once; the engine encodes and
    prefills its whole blocks while idle; then the commit and the response right behind it, as the server does."""
    import asyncio
    import time
    import numpy as np
    import soundfile as sf
    from pipeline.outputs import AudioChunk
    pcm, sr = sf.read("tests/fixtures/speech/weather_today.wav", dtype="float32")
    import soxr
    pcm = soxr.resample(pcm, sr, 16000).astype("float32")
    convs = [engine.conversation() for _ in range(users)]
    inputs = []
    for conv in convs:
        inp = conv.open_audio("u")
        inp.append(np.asarray(pcm))
        inputs.append(inp)
    await engine.wait_idle()
    await asyncio.sleep(0.2)

    async def one(conv, inp):
        t0, first = time.perf_counter(), None
        if asked is not None:
            asked.append(t0)
        commit = inp.commit()
        async for event in conv.respond(item_id="a", modalities=frozenset({"text", "audio"})):
            if first is None and isinstance(event, AudioChunk) and len(event.pcm):
                first = (time.perf_counter() - t0) * 1000
        await commit
        await conv.close()
        return first

    return await asyncio.gather(*(one(c, i) for c, i in zip(convs, inputs)))


if __name__ == "__main__":
    _main()
