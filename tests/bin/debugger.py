"""Every rank stops in pdb at ``breakpoint()``, then reads a line with ``input()``, then reads
on to the end of input: what the launcher's stdin says, each rank prints.

``debugger.py wait``: rank 0 alone stops in pdb, while the others wait for it in a barrier.
"""

import sys

import macfleet

macfleet.init()
if sys.argv[1:] == ["wait"]:
    if macfleet.rank() == 0:
        breakpoint()  # noqa: T100 - the point of the test
    macfleet.barrier()
    print("past the barrier", flush=True)
    macfleet.shutdown()
    sys.exit(0)
answer = 41 + macfleet.rank()
breakpoint()  # noqa: T100 - the point of the test
print(f"after the debugger, answer={answer}", flush=True)
print(f"read {input()!r}", flush=True)
try:
    input()
except EOFError:
    print("end of input", flush=True)
macfleet.shutdown()
