"""Rank 0 prints a line and is held up between its text and its newline, as a rank on a loaded
Mac can be, while rank 1 prints lines: ``stall_mid_line.py DIR``. ``print("held", Stall())``
writes "held" and the separator before it calls ``Stall.__str__``, which holds rank 0 up for
a second (the hold-up is what is tested, not a wait for anything) while rank 1 prints from
the moment DIR/held exists until DIR/resumed does. Rank 0 starts once rank 1 is there
(DIR/ready), so that a rank started late still prints while rank 0 is held."""

import os
import sys
import time

rank = int(os.environ["RANK"])
ready, held, resumed = (os.path.join(sys.argv[1], name) for name in ("ready", "held", "resumed"))


def wait_for(path: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.01)  # polling for the other rank's file, which is the synchronisation


class Stall:
    def __str__(self) -> str:
        open(held, "w").close()
        time.sleep(1.0)  # five times the agent's SETTLE_S: the text so far looks finished
        open(resumed, "w").close()
        return "resumed"


if rank == 0:
    wait_for(ready)
    print("held", Stall())
else:
    open(ready, "w").close()
    wait_for(held)
    i = 0
    while not os.path.exists(resumed):
        print(f"meanwhile {i}")
        i += 1
        time.sleep(0.01)
    print(f"meanwhile {i}")
