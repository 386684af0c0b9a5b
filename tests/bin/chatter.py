"""Every rank prints ``chatter RANK I`` for I in range(N): ``chatter.py N``. Each print is two
writes (the text, then the newline), so the launcher must forward whole lines for the ranks'
lines to stay whole on its output."""

import os
import sys

rank = int(os.environ["RANK"])
for i in range(int(sys.argv[1])):
    print(f"chatter {rank} {i}", flush=True)
