"""Rank 0 prints a line and is held up between its text and its newline, as a rank on a loaded
Mac can be, while rank 1 prints lines: ``stall_mid_line.py DIR``. ``print("held", Stall())``
writes "held" and the separator before it calls ``Stall.__str__``, which holds rank 0 up for
a second (the hold-up is what is tested, not a wait for anything) while rank 1 prints from
the moment DIR/held exists until DIR/resumed does."""

import os
import sys
import time

rank = int(os.environ["RANK"])
held, resumed = (os.path.join(sys.argv[1], name) for name in ("held", "resumed"))


class Stall:
    def __str__(self) -> str:
        open(held, "w").close()
        time.sleep(1.0)  # five times the agent's SETTLE_S: the text so far looks finished
        open(resumed, "w").close()
        return "resumed"


if rank == 0:
    print("held", Stall())
else:
    deadline = time.monotonic() + 60
    while not os.path.exists(held):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.01)  # polling for rank 0's file, which is the synchronisation
    i = 0
    while not os.path.exists(resumed):
        print(f"meanwhile {i}")
        i += 1
        time.sleep(0.01)
    print(f"meanwhile {i}")
