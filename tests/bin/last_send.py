"""``last_send.py NBYTES``: rank 0 broadcasts NBYTES and its script ends at once.

A broadcast's source waits for nobody, so when the call returns its chunks may still be
queued for the network; the other ranks check that every byte arrived all the same.
"""

import sys

import torch

import macfleet

macfleet.init()
expected = torch.arange(int(sys.argv[1]) // 4, dtype=torch.float32)
tensor = expected.clone() if macfleet.rank() == 0 else torch.zeros_like(expected)
# Into the broadcast together: a rank that reaches it over a second late (a loaded machine)
# is rightly a stall under the 1 s stall timeout of the slow-link test, which is about waits
# while data arrives.
macfleet.barrier()
macfleet.broadcast(tensor, 0)
if macfleet.rank() != 0:
    print("received " + ("every byte" if torch.equal(tensor, expected) else "WRONG DATA"), flush=True)
