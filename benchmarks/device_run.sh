#!/usr/bin/env bash
# One batch of measurements on the device machine (CUDA standing in for Metal, 16 cores).
# Usage there: bash benchmarks/device_run.sh PART   (PART: allreduce | gpu | join | join-cost | train | all; tuning: slots | chunks | parts)
# For the NCCL ceiling (one process per GPU), on a machine of several GPUs: bash benchmarks/device_run.sh nccl
# NPROCS="2 4" picks the rank counts of allreduce (8 alone fits the 10-minute limit); THREADS="4 2 1" the
# threads per rank of train's CPU runs.
set -u
part=${1:-all}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
REPO=$(pwd)
mkdir -p /tmp/run && cd /tmp/run  # not the repo root: there `python3 -m macfleet.launcher.cli` (mf) would import its macfleet/ folder
mf() { python3 -m macfleet.launcher.cli "$@"; }
bytes_of() { python3 -c "import sys; from macfleet.knobs import parse_size; print(parse_size(sys.argv[1]))" "$1"; }  # 4M -> 4194304
nproc; lscpu | grep -E "Model name|L3|NUMA node\(s\)"; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
if [ "$part" = allreduce ] || [ "$part" = all ]; then
  for n in ${NPROCS:-2 4 8}; do
    mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 1 --json $OUT/allreduce_shm_$n.json
    mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 1 --shared-tensors --json $OUT/allreduce_shared_$n.json
    MACFLEET_SHM=0 mf bench allreduce --nproc $n --sizes 4K,1M,16M,64M,256M --budget 1 --json $OUT/allreduce_tcp_$n.json
    MACFLEET_SHM=0 MACFLEET_STREAMS=2 mf bench allreduce --nproc $n --sizes 16M,64M,256M --budget 1 --json $OUT/allreduce_tcp_${n}_streams2.json
  done
fi
if [ "$part" = slots ]; then  # tuning: shared-memory slot size per rank (MACFLEET_SHM_SLOT_BYTES)
  for n in ${NPROCS:-2 4 8}; do for slot in ${SLOTS:-16M 4M 1M 256K}; do
    MACFLEET_SHM_SLOT_BYTES=$(bytes_of $slot) \
      mf bench allreduce --nproc $n --sizes ${SIZES:-16M,64M,256M} --budget 0.5 --json $OUT/slots_${n}_$slot.json
  done; done
fi
if [ "$part" = chunks ]; then  # tuning: the ring's pipeline chunk (MACFLEET_CHUNK_BYTES), shared memory off
  for n in ${NPROCS:-4 8}; do for chunk in ${CHUNKS:-4M 1M 256K}; do
    MACFLEET_SHM=0 MACFLEET_CHUNK_BYTES=$(bytes_of $chunk) \
      mf bench allreduce --nproc $n --sizes ${SIZES:-1M,16M,64M} --budget 0.5 --json $OUT/chunks_${n}_$chunk.json
  done; done
fi
if [ "$part" = parts ]; then  # tuning: the smallest part per member that gets its own channel (MACFLEET_MIN_PART_BYTES)
  for n in ${NPROCS:-4 8}; do for p in ${PARTS:-256K 64K}; do
    MACFLEET_SHM=0 MACFLEET_MIN_PART_BYTES=$(bytes_of $p) \
      mf bench allreduce --nproc $n --sizes ${SIZES:-256K,1M,4M} --budget 0.5 --json $OUT/parts_${n}_$p.json
  done; done
fi
if [ "$part" = gpu ] || [ "$part" = all ]; then
  for n in 2 4; do mf launch --nproc $n --device cuda $REPO/tests/bin/cuda_check.py; done
  mf launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/mnist2
  mf launch --nproc 4 --device cuda $REPO/examples/mnist/train.py --epochs 1 --train-url /tmp/mnist4
  mf launch --nproc 2 --device cuda $REPO/examples/mnist/train.py --epochs 1 --amp
fi
# model.join() on CUDA, 3 ranks; benchmarks/results/2026-11-24-session27/check_join.py compares what comes back
# with tests/test_data_parallel.py's join_reference (CASE/training-thread: device copies as on MPS)
if [ "$part" = join ] || [ "$part" = gpu ] || [ "$part" = all ]; then
  rm -rf /tmp/join  # join_cases.py writes /tmp/join/CASE[/training-thread]/rank{r}.pt
  mf launch --nproc 3 --device cuda $REPO/tests/bin/join_cases.py uneven,accumulate,own-buffers /tmp/join
  mf launch --nproc 3 --device cuda $REPO/tests/bin/join_cases.py uneven,own-buffers /tmp/join training-thread
  MACFLEET_SHM=0 mf launch --nproc 3 --device cuda $REPO/tests/bin/join_cases.py fp16 /tmp/join
  tar -C /tmp -cf $OUT/join_cuda.tar join
fi
if [ "$part" = join-cost ]; then  # the same runs with every step inside join() and without (both libraries)
  for j in "" --join; do
    python3 $REPO/benchmarks/train_throughput.py --nprocs 2,4 --device cpu --threads-per-rank 4 --steps 40 \
      --models cnn,large $j --json $OUT/train_cpu${j/--/_}.json
    python3 $REPO/benchmarks/train_throughput.py --nprocs 2,4 --device cuda --steps 30 --models cnn,large $j \
      --json $OUT/train_cuda${j/--/_}.json
  done
fi
if [ "$part" = train ] || [ "$part" = all ]; then
  python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --steps 20 --json $OUT/train_cpu.json
  for k in ${THREADS:-4}; do  # 40 steps: single steps of this shared machine vary up to 2x
    python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cpu --threads-per-rank $k --steps 40 \
      --models large,deep --json $OUT/train_cpu_${k}threads.json
  done
  python3 $REPO/benchmarks/train_throughput.py --nprocs 1,2,4 --device cuda --steps 30 --json $OUT/train_cuda.json
fi
if [ "$part" = nccl ]; then  # 1, 2, 4... processes, up to one per GPU
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
  counts=$(python3 -c "import sys; n = int(sys.argv[1]); print(','.join(str(1 << k) for k in range(n.bit_length()) if 1 << k <= n))" "$gpus")
  python3 $REPO/benchmarks/train_throughput.py --nprocs $counts --device cuda --steps 30 --ddp-backend nccl --json $OUT/train_nccl_${gpus}gpu.json
  python3 $REPO/benchmarks/train_throughput.py --nprocs $counts --device cuda --steps 30 --json $OUT/train_gloo_${gpus}gpu.json
fi
