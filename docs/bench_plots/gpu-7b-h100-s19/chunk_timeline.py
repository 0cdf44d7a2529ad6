"""Print one profile level of scripts/profile_steps.py --timeline (clock.json): each response's audio chunks as
ms:audio ms(audio ahead of its real-time player before it), the token2wav jobs as start+ms/streams[F first chunks],
and the engine steps per 200 ms. Usage: python chunk_timeline.py clock.json USERS"""
import json, sys, collections
r = json.load(open(sys.argv[1]))[sys.argv[2]]
asked = r["asked_ms"]
chunks = r["audio_chunks"]; jobs = r["token2wav_jobs"]; steps = r["timeline"]
by = collections.defaultdict(list)
for t, rid, n, w in chunks: by[rid].append((t, n, w))
order = sorted(by, key=lambda k: by[k][0][0])
print("per response: (t ms, audio ms, ahead-before ms / waited)")
for rid in order:
    end = None; out = []
    for t, n, w in by[rid]:
        ahead = None if end is None else end - t
        if end is None or end < t: end = t
        end += n / 24
        out.append(f"{t:.0f}:{n/24:.0f}" + ("" if ahead is None else f"({ahead:+.0f})"))
    print(rid, " ".join(out[:9]))
print("jobs (start, ms, n, firsts):")
print(" ".join(f"{a:.0f}+{w:.0f}/{n}{'F'+str(f) if f else ''}" for a, w, n, f in jobs if a < 4000))
# steps per 200ms window
win = collections.defaultdict(list)
for a, w, kind, text, codes in steps:
    win[int(a // 200)].append((w, kind))
print("steps per 200 ms: window: n, mean wall, kinds")
for k in sorted(win):
    if k*200 > 4000: break
    v = win[k]; kinds = collections.Counter(kd for _, kd in v)
    print(f"{k*200:5d}: {len(v):3d} {sum(w for w,_ in v)/len(v):6.1f}ms {dict(kinds)}")
