source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
git log --oneline -1 2>/dev/null || true
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots"
date -u +%T; $B --codec-tokens 50 --turn-timeout-s 200 --concurrency 1,4,16,32,64 --out $OUT/sweep > $OUT/sweep.log 2>&1; echo "sweep rc=$?"
date -u +%T; $B --codec-tokens 50 --turn-timeout-s 120 --concurrency 16 --out $OUT/u16 > $OUT/u16.log 2>&1; echo "u16 rc=$?"
date -u +%T; $B --codec-tokens 250 --turn-timeout-s 200 --concurrency 32 --out $OUT/long32 > $OUT/long32.log 2>&1; echo "long32 rc=$?"
date -u +%T
for x in sweep u16 long32; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/$x/wait.md; grep users $OUT/$x/wait.md; done
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s18c.tgz sweep u16 long32 *.log && rm -rf sweep u16 long32 *.log
