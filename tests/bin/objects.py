"""Object collectives against what each rank can compute alone: ``objects.py``.

Every rank gathers an object whose pickle differs in size from rank to rank (rank 0's is the
smallest), and receives one from the last rank; then it prints ``objects ok``.
"""

import macfleet


def made_by(rank):
    return {"rank": rank, "words": ["word"] * (100 * rank), "pair": (rank, None), "set": {rank, 2 * rank}}


macfleet.init()
rank, world = macfleet.rank(), macfleet.world_size()
gathered = macfleet.all_gather_object(made_by(rank))
assert gathered == [made_by(r) for r in range(world)], gathered
chosen = macfleet.broadcast_object(made_by(rank) if rank == world - 1 else "not this", src=world - 1)
assert chosen == made_by(world - 1), chosen
assert macfleet.all_gather_object(None) == [None] * world
print("objects ok", flush=True)
macfleet.shutdown()
