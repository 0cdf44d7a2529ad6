source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots"
cfg() { [ $1 = base ] && echo "" || echo "--stage-config .device/$1.yaml"; }
bench() { v=$1; n=$2; shift 2; [ $SECONDS -gt 480 ] && { echo "skip $n"; return; }
  date -u +%T; $B $(cfg $v) "$@" --out $OUT/$n > $OUT/$n.log 2>&1; echo "$n rc=$?"
  sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$n/report.md | grep -E "^\| [0-9]+ "
  grep -o '[0-9]* underruns ([0-9]* ms)' $OUT/$n.log | awk '{n+=$1; if($1>0)t++} END {print "engine underruns", n, "in", t, "responses"}'
  grep -o 'underruns ([0-9]* ms) (#.*) of a' $OUT/$n.log | cut -c1-200 | head -6; }
L="--codec-tokens 250 --turn-timeout-s 200 --concurrency 32"
bench base l-base3 $L
bench gbs l-gbs1 $L
bench gb l-gb1 $L
bench gbs l-gbs2 $L
bench base l-base4 $L
date -u +%T
grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s20b.tgz l-* && rm -rf l-*
