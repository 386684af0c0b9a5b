"""Every rank stops in pdb at ``breakpoint()``, then reads a line with ``input()``, then reads
on to the end of input: what the launcher's stdin says, each rank prints.

``debugger.py wait pdb``: rank 0 alone stops in pdb, while the others wait for it in a
barrier; ``wait input``, ``wait readline`` (reading ``sys.stdin`` itself) and ``wait getpass``:
it asks for a line instead.
"""

import getpass
import sys

import macfleet

macfleet.init()
if sys.argv[1:2] == ["wait"]:
    if macfleet.rank() == 0:
        if sys.argv[2] == "pdb":
            breakpoint()  # noqa: T100 - the point of the test
        elif sys.argv[2] == "input":
            print(f"read {input('overwrite the checkpoint? [y/N] ')!r}", flush=True)
        elif sys.argv[2] == "readline":
            print("overwrite the checkpoint? [y/N] ", end="", flush=True)
            print(f"read {sys.stdin.readline().rstrip()!r}", flush=True)
        else:  # as a hub's login asks for a token; a rank has no terminal: getpass reads stdin
            print(f"read {getpass.getpass('token: ')!r}", flush=True)
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
