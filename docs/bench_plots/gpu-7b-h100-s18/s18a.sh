source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --turns 1 --concurrency 16,32 --no-plots"
for r in 1 2; do for v in base v1; do
  sc=""; [ $v != base ] && sc="--stage-config .device/$v.yaml"
  date -u +%T; $B $sc --out $OUT/$v-$r > $OUT/$v-$r.log 2>&1; echo "$v-$r rc=$?"
done; done; date -u +%T
for x in base-1 v1-1 base-2 v1-2; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/$x/wait.md; cat $OUT/$x/wait.md | grep users; done
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s18a.tgz base-1 v1-1 base-2 v1-2 *.log && rm -rf base-1 v1-1 base-2 v1-2 *.log
