source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots"
run() { v=$1; shift; c=""; [ $v = base ] || c="--stage-config .device/$v.yaml"; n=$1; shift
  date -u +%T; $B $c "$@" --out $OUT/$n > $OUT/$n.log 2>&1; echo "$n rc=$?"
  sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$n/report.md | grep -E "^\| [0-9]+ "; python3 scripts/first_chunk_wait.py $OUT/$n.log > $OUT/$n/wait.md; grep users $OUT/$n/wait.md
  grep -o '[0-9]* underruns ([0-9]* ms) of a' $OUT/$n.log | awk '{n+=$1; if($1>0)t++} END {print "engine underruns", n, "in", t, "responses"}'; }
L="--codec-tokens 250 --turn-timeout-s 200 --concurrency 32"
S="--codec-tokens 50 --turn-timeout-s 120 --concurrency 16,32"
run la3 l-la3 $L
run la3j l-la3j $L
run base l-base $L
run la3 s-la3 $S
run la3j s-la3j $S
date -u +%T
grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s19d.tgz l-* s-* && rm -rf l-* s-*
