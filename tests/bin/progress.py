"""A progress bar: ``progress.py DIR``. Rank 0 draws its first state with a carriage return and
no newline, as tqdm does, and waits for DIR/go2; the other ranks wait for DIR/go, then draw a
bar of their own to its end and print a line (while rank 0's bar is still open), and finish. The test creates go once it has seen the
bar, and go2 once it has seen the other ranks' lines. A rank exits 3 if its file never comes
(what it waited on never reached the launcher's output)."""

import os
import sys
import time

rank = int(os.environ["RANK"])


def wait_for(name: str) -> None:
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(sys.argv[1], name)):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.05)  # polling for the test's file, which is the synchronisation


if rank == 0:
    sys.stderr.write("\rstep 1/2")
    sys.stderr.flush()
    wait_for("go2")
    sys.stderr.write("\rstep 2/2\n")
else:
    wait_for("go")
    # a bar of its own, drawn while rank 0's is open (in one write: its redraws arrive together)
    sys.stderr.write("\rbar 1/3\rbar 2/3\rbar 3/3\n")
    sys.stderr.write(f"rank {rank} says hello\n")
