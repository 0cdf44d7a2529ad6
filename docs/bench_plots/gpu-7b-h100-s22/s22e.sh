# usage: bash .device/s22e.sh LEVELS NAME  (the sweep beside transformers' reference, at the packaged config)
source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 200 --turns 1 --no-plots"
date -u +%T; $B --concurrency $1 --reference --out $OUT/$2 > $OUT/$2.log 2>&1; echo "$2 rc=$?"; date -u +%T
cat $OUT/$2/report.md | grep -E '^\| [0-9]+ '
python3 scripts/first_chunk_wait.py $OUT/$2.log > $OUT/wait-$2.md; head -20 $OUT/wait-$2.md
grep -o '[0-9]* underruns ([0-9]* ms)' $OUT/$2.log | awk '{n+=$1; if($1>0)t++} END {print "engine underruns", n, "in", t, "responses"}'
echo "held: $(grep -c 'first audio held' $OUT/$2.log)"
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
