set -u
R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/oldsite .old/src >/dev/null 2>&1
mkdir -p /tmp/run && cd /tmp/run
for v in ${ORDER:-old new new old old new new old}; do
  if [ $v = old ]; then P=/tmp/oldsite:/tmp/site; E=$R/.old/src/examples/mnist/train.py; else P=/tmp/site; E=$R/examples/mnist/train.py; fi
  echo "$v $(PYTHONPATH=$P python3 -m macfleet.launcher.cli launch --nproc 2 --device ${DEV:-cuda} $E --epochs ${EPOCHS:-1} 2>&1 | grep -o '[0-9,]* samples/s ([0-9.]* s)' | tr '\n' ' ')"
done
