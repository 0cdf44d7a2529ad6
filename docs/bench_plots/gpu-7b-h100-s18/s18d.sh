source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots --turn-timeout-s 200"
date -u +%T; $B --codec-tokens 50 --concurrency 16,32 --stage-config .device/m400.yaml --out $OUT/m400 > $OUT/m400.log 2>&1; echo "m400 rc=$?"
date -u +%T; $B --codec-tokens 250 --concurrency 32 --stage-config .device/m400.yaml --out $OUT/m400long > $OUT/m400long.log 2>&1; echo "m400long rc=$?"
date -u +%T; $B --codec-tokens 250 --concurrency 32 --out $OUT/long32 > $OUT/long32.log 2>&1; echo "long32 rc=$?"
date -u +%T
for x in m400 m400long long32; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/$x/wait.md; grep users $OUT/$x/wait.md; done
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s18d.tgz m400 m400long long32 *.log && rm -rf m400 m400long long32 *.log
