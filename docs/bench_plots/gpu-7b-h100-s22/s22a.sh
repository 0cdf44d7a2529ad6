source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots"
# a variant config: bench_forced.yaml (or .device/$1.yaml) with the engine's timeline written to $OUT/$2.json
tl() { python3 - "$1" "$OUT/$2.json" > .device/tl-$2.yaml <<'PY'
import sys, yaml
src = "pipeline/stage_configs/bench_forced.yaml" if sys.argv[1] == "base" else f".device/{sys.argv[1]}.yaml"
raw = yaml.safe_load(open(src))
raw.setdefault("engine", {})["timeline_path"] = sys.argv[2]
print(yaml.safe_dump(raw))
PY
echo "--stage-config .device/tl-$2.yaml"; }
bench() { v=$1; n=$2; shift 2; [ $SECONDS -gt ${LIMIT:-470} ] && { echo "skip $n"; return; }
  date -u +%T; $B $(tl $v $n) "$@" --out $OUT/$n > $OUT/$n.log 2>&1; echo "$n rc=$?"
  sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$n/report.md | grep -E "^\| [0-9]+ "
  grep -o '[0-9]* underruns ([0-9]* ms)' $OUT/$n.log | awk '{n+=$1; if($1>0)t++} END {print "engine underruns", n, "in", t, "responses"}'
  echo "held: $(grep -c "first audio held" $OUT/$n.log)"
  python3 scripts/engine_timeline.py $OUT/$n.json --late 2>/dev/null | head -8; }
L="--codec-tokens 250 --turn-timeout-s 200 --concurrency 32"
bench sb l-sb1 $L
bench sbl l-sbl1 $L
bench sb l-sb2 $L
bench sbl l-sbl2 $L
bench sb l-sb3 $L
date -u +%T
grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s22a.tgz l-* && rm -rf l-*
