"""K processes copy S bytes private->shared and shared->private at once: torch copy_ vs libc memmove."""
import ctypes, mmap, multiprocessing as mp, os, sys, time, statistics
from concurrent.futures import ThreadPoolExecutor

def worker(k, K, S, bar, q, methods, reps):
    import torch
    torch.set_num_threads(max(1, 16 // K))
    fd = os.open("/dev/shm/ntbench", os.O_RDWR)
    m = mmap.mmap(fd, K * S); os.close(fd)
    shm = torch.frombuffer(m, dtype=torch.uint8).view(K, S)
    src = torch.randn(S // 4).view(torch.uint8); dst = torch.empty(S, dtype=torch.uint8)
    pool = ThreadPoolExecutor(4)
    mm = ctypes.memmove
    def mcopy(d, s, parts):
        n = d.numel(); dp, sp = d.data_ptr(), s.data_ptr()
        if parts == 1:
            mm(dp, sp, n); return
        step = -(-n // parts) // 64 * 64 + 64
        list(pool.map(lambda a: mm(dp + a, sp + a, min(step, n - a)), range(0, n, step)))
    res = {}
    for meth in methods:
        ts = []
        for r in range(reps):
            bar.wait(); t = time.perf_counter()
            mine, other = shm[k], shm[(k + 1) % K]
            if meth == "torch":
                mine.copy_(src); bar.wait(); dst.copy_(other)
            else:
                p = int(meth[2:]) if meth.startswith("mm") and len(meth) > 2 else 1
                mcopy(mine, src, p); bar.wait(); mcopy(dst, other, p)
            bar.wait(); ts.append(time.perf_counter() - t)
        assert torch.equal(dst, shm[(k + 1) % K])
        res[meth] = statistics.median(ts[2:])
    q.put((k, res))

if __name__ == "__main__":
    reps = 15
    for K in [int(x) for x in sys.argv[1].split(",")]:
        for S in [int(x) << 20 for x in sys.argv[2].split(",")]:
            with open("/dev/shm/ntbench", "wb") as f: f.truncate(K * S)
            methods = ["torch", "mm", "mm2", "torch", "mm", "mm2"]
            bar, q = mp.Barrier(K), mp.Queue()
            ps = [mp.Process(target=worker, args=(k, K, S, bar, q, methods, reps)) for k in range(K)]
            [p.start() for p in ps]; out = [q.get() for _ in ps]; [p.join() for p in ps]
            worst = {m: max(r[m] for _, r in out) for m in out[0][1]}
            print(f"K={K} S={S>>20}MiB " + " ".join(f"{m}={v*1e3:.2f}ms ({2*K*S/v/1e9:.0f} GB/s moved)" for m, v in worst.items()), flush=True)
            os.unlink("/dev/shm/ntbench")
