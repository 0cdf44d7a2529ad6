source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
P="python3 scripts/profile_steps.py --model random:7b --device cuda --threads 4 --text-tokens 10 --codec-tokens 250 --no-trace --timeline"
date -u +%T; $P --users 16,32 --spread-ms 700 --out $OUT/spread > $OUT/spread.log 2>&1; echo "spread rc=$?"
date -u +%T; $P --users 16 --spread-ms 0 --out $OUT/burst > $OUT/burst.log 2>&1; echo "burst rc=$?"
date -u +%T; $P --users 16,32 --spread-ms 700 --stage-config .device/jobs.yaml --out $OUT/jobs > $OUT/jobs.log 2>&1; echo "jobs rc=$?"
date -u +%T
for x in spread burst jobs; do grep -E '"underruns"|== ' $OUT/$x.log; done
grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s19b.tgz spread burst jobs *.log && rm -rf spread burst jobs *.log
