source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots --turn-timeout-s 200 --codec-tokens 250 --concurrency 16"
date -u +%T; $B --out $OUT/new16 > $OUT/new16.log 2>&1; echo "new16 rc=$?"
date -u +%T; $B --stage-config .device/old.yaml --out $OUT/old16 > $OUT/old16.log 2>&1; echo "old16 rc=$?"
date -u +%T
for x in new16 old16; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/$x/wait.md; grep users $OUT/$x/wait.md; done
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s18f.tgz new16 old16 *.log && rm -rf new16 old16 *.log
