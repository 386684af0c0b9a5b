"""How far one rank falls behind the slowest of N from uneven compute alone: from the bare
model's step times (train_throughput.py's "local", no exchange at all; rank 0's, in the order
taken), the mean of (the longest of N steps drawn at random) - (one step drawn at random)."""
import json, random, statistics as S, sys
for path in sys.argv[1:]:
    for r in json.load(open(path)):
        if r["world"] < 2 or r["library"] != "local":
            continue
        ts = [t * 1e3 for t in r["rank0_steps_s"]]
        rng = random.Random(0)
        lag = S.mean(max(rng.sample(ts, r["world"])) - rng.choice(ts) for _ in range(20000))
        mf = next(m for m in json.load(open(path)) if m["model"] == r["model"] and m["world"] == r["world"]
                  and m["library"] == "macfleet")
        print(f"{path} {r['model']} N={r['world']}: bare step median {S.median(ts):.1f} ms, sd {S.pstdev(ts):.1f}; "
              f"expected lag {lag:.1f} ms ({lag / S.median(ts):.0%} of the bare step, "
              f"{lag / (mf['step_s'] * 1e3):.0%} of macfleet's); macfleet's measured behind "
              f"{mf['behind_share']:.0%}, tail {mf['tail_share']:.0%}, wait {mf['wait_share']:.0%}")
