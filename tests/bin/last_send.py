"""``last_send.py NBYTES``: rank 0 broadcasts NBYTES and every script ends at once.

On the ring a rank that passes the chunks on waits for nobody (only the source waits, for the
last rank's answer), so when its call returns its chunks may still be queued for the network;
the other ranks check that every byte arrived all the same.
"""

import sys

import torch

import macfleet

macfleet.init()
expected = torch.arange(int(sys.argv[1]) // 4, dtype=torch.float32)
tensor = expected.clone() if macfleet.rank() == 0 else torch.zeros_like(expected)
macfleet.broadcast(tensor, 0)
if macfleet.rank() != 0:
    print("received " + ("every byte" if torch.equal(tensor, expected) else "WRONG DATA"), flush=True)
