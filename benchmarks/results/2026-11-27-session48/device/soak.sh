# session 48, device: random collective cases and DataParallel cases, four soaks at once on 16 cores
# run 1: SEEDS="201 202 203" DP_SEED=301 (bdbf9a8^, before the inference fix); run 2: SEEDS="211 212 213" DP_SEED=311
python3 -m pip install -q --no-index --no-deps --no-build-isolation --break-system-packages .whl/*.whl .whl/test/*.whl . >/tmp/pip.log 2>&1 || { echo install failed; tail -5 /tmp/pip.log; }
R=$(pwd); mkdir -p /tmp/run && cd /tmp/run
nproc; python3 -c "import torch, zmq; print(torch.__version__, zmq.__version__)"
T=${1:-480}
for s in ${SEEDS:-201 202 203}; do
  timeout $T python3 $R/benchmarks/results/2026-11-27-session48/cases_soak.py $s 100000 /tmp/cs-$s > $OUT/cases_$s.log 2>&1 &
done
timeout $T python3 $R/benchmarks/results/2026-11-27-session48/dp_soak.py ${DP_SEED:-301} 100000 /tmp/dp-301 > $OUT/dp.log 2>&1 &
wait
for f in $OUT/*.log; do echo "== $f: $(grep -c ' ok ' $f) ok, $(grep '^job' $f | grep -vc ' ok ') not"; grep '^job' $f | grep -v ' ok ' | head -5; done
sleep 5; echo "left: $(ps -e -o args= | grep -c '[b]ootstrap')"
