"""Every rank stops in pdb at ``breakpoint()``, then reads a line with ``input()``, then reads
on to the end of input: what the launcher's stdin says, each rank prints."""

import macfleet

macfleet.init()
answer = 41 + macfleet.rank()
breakpoint()  # noqa: T100 - the point of the test
print(f"after the debugger, answer={answer}", flush=True)
print(f"read {input()!r}", flush=True)
try:
    input()
except EOFError:
    print("end of input", flush=True)
macfleet.shutdown()
