"""Many jobs of DataParallel cases (tests/bin/dp_cases.py) at random world sizes and knobs, each
case's parameters checked against one process on the whole batch. python dp_soak.py SEED JOBS [OUTDIR]"""
import pathlib, random, sys, tempfile, time

from soak_jobs import LAUNCH, arguments, drawer, run_job, settle

ROOT = pathlib.Path(__file__).resolve().parents[3]  # the checkout
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests/bin")]
import torch
from test_data_parallel import JOBS, CHECKED_IN_THE_JOB, TOLERANCE, reference

POOL = sorted({c for _, cases in JOBS.values() for c in cases} | {"buckets", "fp16", "bf16"})
refs = {}


def knobs(rng):
    env = {}
    pick = drawer(rng, env)
    pick("MACFLEET_SHM", [0, 1], 0.4)
    pick("MACFLEET_CHUNK_BYTES", [1000, 4096, 65536])
    pick("MACFLEET_SMALL_BYTES", [64, 256, 4096])
    pick("MACFLEET_STREAMS", [1, 2, 3])
    pick("MACFLEET_MIN_PART_BYTES", [256, 4096])
    pick("MACFLEET_ZERO_COPY_BYTES", [1], 0.3)
    pick("MACFLEET_INLINE_BYTES", [64], 0.3)
    pick("MACFLEET_SHM_SLOT_BYTES", [65536, 1 << 20], 0.3)
    pick("MACFLEET_SHM_GATHER_BYTES", [1], 0.3)
    pick("MACFLEET_SHM_OBJECTS", [0, 1], 0.3)
    return env


def main():
    seed, jobs, outdir = arguments("dpsoak-")
    rng = random.Random(seed)
    bad = 0
    for j in range(jobs):
        env = knobs(rng)
        world = rng.choice([2, 3, 4, 6])
        pool = [c for c in POOL if not (c == "shares" and world > 3) and not (c == "compiled" and rng.random() < 0.7)]
        cases = rng.sample(pool, rng.randint(3, 8))
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"job{j}-", dir=outdir))
        if rng.random() < 0.3:
            env["MACFLEET_LAUNCH_TIMELINE"] = str(work / "timeline.json")
        cmd = [*LAUNCH, "--nproc", str(world), "--device", "cpu",
               str(ROOT / "tests/bin/dp_cases.py"), ",".join(cases), str(work)]
        t0 = time.time()
        verdict, out = run_job(cmd, env)
        wrong = []
        if verdict == "ok":
            for case in cases:
                if case in CHECKED_IN_THE_JOB:
                    continue
                if case not in refs:
                    refs[case] = reference(case)
                got = torch.load(work / f"{case}.pt")
                tol = TOLERANCE.get(case, 1e-5)
                err = max((got[n] - v).abs().max().item() for n, v in refs[case].items())
                if err > tol:
                    wrong.append(f"{case} {err:.3g}")
        if wrong:
            verdict = "WRONG " + ", ".join(wrong)
        print(f"job {j} world {world} {time.time() - t0:.1f}s {verdict} cases {','.join(cases)} "
              f"{' '.join(f'{k[9:]}={v}' for k, v in sorted(env.items()) if 'TIMELINE' not in k)}", flush=True)
        bad += settle(work, verdict, out)
    print(f"done: {jobs} jobs, {bad} bad; kept in {outdir}", flush=True)


if __name__ == "__main__":
    main()
