"""Compare the device run's ``model.join()`` results (``device_run.sh join``: 3 ranks on one
CUDA GPU) with one CPU process training every rank's batches (the test's ``join_reference``).

    tar -C /tmp -xf join_cuda.tar && python check_join.py /tmp/join > join_cuda.json
"""

import json
import os
import sys

import torch

TESTS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests")
sys.path[:0] = [TESTS, os.path.join(TESTS, "bin")]
from test_data_parallel import TOLERANCE, join_reference  # noqa: E402

root, rows = sys.argv[1], []
for where in ("uneven", "accumulate", "own-buffers", "fp16", "uneven/training-thread", "own-buffers/training-thread"):
    case = where.split("/")[0]
    params, buffers, momentum = join_reference(case)
    worst = 0.0
    for rank in range(3):
        got = torch.load(os.path.join(root, where, f"rank{rank}.pt"))
        worst = max([worst]
                    + [(got["model"][k] - v).abs().max().item() for k, v in params.items()]
                    + [(got["model"][k] - v).abs().max().item() for k, v in buffers[rank].items()]
                    + [(a - b).abs().max().item() for a, b in zip(got["momentum"], momentum, strict=True)])
    rows.append({"case": where, "max_abs_diff": worst, "tolerance": TOLERANCE.get(case, 1e-5)})
json.dump(rows, sys.stdout, indent=1)
print()
