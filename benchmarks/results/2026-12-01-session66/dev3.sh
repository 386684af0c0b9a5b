set -u
cd /tmp && mkdir -p run && cd - >/dev/null
python3 -c "import torch; print(torch.__version__)"
timeout 560 python3 .exp/hookcost.py many,cnn 1,4,8 2>&1 | grep -v -i "numpy" | tee $OUT/hookcost.log
