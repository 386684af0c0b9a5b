import torch, time, sys
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(threads)
def t(f, reps=200):
    for _ in range(5): f()
    s = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - s) / reps * 1e6
for n_ranks, slot in ((8, 4 << 20), (4, 16 << 20)):
    share = slot // 4 // n_ranks  # elements of one rank's share of a round
    seg = torch.randn(n_ranks, slot // 4)
    src = torch.randn(slot // 4); out = src; res = torch.empty(share)
    me = 3; a, b = me * share, (me + 1) * share
    rows = [seg[j, a:b] for j in range(n_ranks)]
    def chain():
        others = [src[a:b]] + rows[:me] + rows[me + 1:]
        torch.add(others[0], others[1], out=out[a:b])
        for r in others[2:]:
            torch.add(out[a:b], r, out=out[a:b])
        res.copy_(out[a:b])
    def summed():
        seg[me, a:b].copy_(src[a:b])
        torch.sum(seg[:, a:b], dim=0, out=out[a:b])
        res.copy_(out[a:b])
    print(f"N={n_ranks} share {share * 4 >> 10} KiB threads {threads}: chain {t(chain):.0f} us, copy+sum {t(summed):.0f} us")
