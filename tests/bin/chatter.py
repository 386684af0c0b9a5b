"""Every rank prints ``chatter RANK I`` for I in range(N): ``chatter.py N``. Four ranks' lines
reach one output through two agents and, from remote hosts, through ssh, which delivers them in
packets that need not end at a line's end: the launcher must forward whole lines for them to
stay whole on its output."""

import os
import sys

rank = int(os.environ["RANK"])
for i in range(int(sys.argv[1])):
    print(f"chatter {rank} {i} {'.' * 100}", flush=True)  # long lines: more of ssh's packets end mid-line
