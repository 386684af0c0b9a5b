import time, resource, macfleet
macfleet.init()
rank = macfleet.rank()
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
macfleet.barrier()
c0, w0 = cpu(), time.monotonic()
if rank == 1:
    time.sleep(3.0)
macfleet.barrier()
c1, w1 = cpu(), time.monotonic()
if True:
    print(f"rank {rank} waited {w1 - w0:.2f} s in a barrier using {100 * (c1 - c0) / (w1 - w0):.1f}% of a core")
