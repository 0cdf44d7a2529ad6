source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
P="python3 scripts/profile_steps.py --model random:7b --device cuda --threads 4 --text-tokens 10 --codec-tokens 250 --no-trace --timeline --users 16,32 --spread-ms 700"
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots --codec-tokens 250 --turn-timeout-s 200 --concurrency 32"
for v in base la3 la3nq nq; do
  c=""; [ $v = base ] || c="--stage-config .device/$v.yaml"
  date -u +%T; $P $c --out $OUT/p-$v > $OUT/p-$v.log 2>&1; echo "p-$v rc=$?"; grep -E '"underruns"|== ' $OUT/p-$v.log
done
for v in la3 base; do
  c=""; [ $v = base ] || c="--stage-config .device/$v.yaml"
  date -u +%T; $B $c --out $OUT/b-$v > $OUT/b-$v.log 2>&1; echo "b-$v rc=$?"
  sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/b-$v/report.md | grep -E "^\| [0-9]+ "; python3 scripts/first_chunk_wait.py $OUT/b-$v.log > $OUT/b-$v/wait.md; grep users $OUT/b-$v/wait.md
  grep -o '[0-9]* underruns ([0-9]* ms) of a' $OUT/b-$v.log | awk '{n+=$1; if($1>0)t++} END {print "engine underruns", n, "in", t, "responses"}'
done
date -u +%T
grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s19c.tgz p-* b-* && rm -rf p-* b-*
