"""Many jobs of join() cases (tests/bin/join_cases.py) at random world sizes, batch counts and
knobs, every rank's parameters, buffers and momentum against one process. python join_soak.py SEED JOBS [OUTDIR]"""
import os, pathlib, random, sys, tempfile, time

from soak_jobs import LAUNCH, arguments, drawer, run_job, settle

ROOT = pathlib.Path(__file__).resolve().parents[3]  # the checkout
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests/bin")]
import torch
from test_data_parallel import JOIN_JOBS, TOLERANCE, join_reference

GROUPS = {name: (env, [c for c in cases if c != "uneven"]) for name, (env, cases) in JOIN_JOBS.items()}


def knobs(rng):
    env = {}
    pick = drawer(rng, env)
    pick("MACFLEET_CHUNK_BYTES", [1000, 4096, 65536])
    pick("MACFLEET_SMALL_BYTES", [64, 256, 4096])
    pick("MACFLEET_STREAMS", [1, 2, 3])
    pick("MACFLEET_MIN_PART_BYTES", [256, 4096])
    pick("MACFLEET_SHM_SLOT_BYTES", [4096, 65536], 0.3)
    pick("MACFLEET_SHM_OBJECTS", [0, 1], 0.3)
    return env


def main():
    seed, jobs, outdir = arguments("joinsoak-")
    rng = random.Random(seed)
    bad = 0
    for j in range(jobs):
        group = rng.choice(sorted(GROUPS))
        env = {**knobs(rng), **GROUPS[group][0]}
        if group == "default" and rng.random() < 0.3:
            env["MACFLEET_SHM"] = "0"
        world = rng.choice([2, 3, 4, 5])
        counts = [rng.randint(0, 6) for _ in range(world)]
        if max(counts) == 0:
            counts[rng.randrange(world)] = 1
        env["JOIN_STEPS"] = ",".join(map(str, counts))
        cases = rng.sample(GROUPS[group][1], min(len(GROUPS[group][1]), rng.randint(1, 4)))
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"job{j}-", dir=outdir))
        cmd = [*LAUNCH, "--nproc", str(world), "--device", "cpu",
               str(ROOT / "tests/bin/join_cases.py"), ",".join(cases), str(work)]
        t0 = time.time()
        verdict, out = run_job(cmd, env)
        wrong = []
        if verdict == "ok":
            os.environ["JOIN_STEPS"] = env["JOIN_STEPS"]
            for case in cases:
                params, buffers, momentum = join_reference(case, world)
                tol = TOLERANCE.get(case, 1e-5)
                for rank in range(world):
                    got = torch.load(work / case / f"rank{rank}.pt")
                    errs = [(got["model"][n] - v).abs().max().item() for n, v in params.items()]
                    errs += [(got["model"][n] - v).abs().max().item() for n, v in buffers[rank].items()]
                    errs += [(a - b).abs().max().item() for a, b in zip(got["momentum"], momentum, strict=True)]
                    if max(errs) > tol:
                        wrong.append(f"{case} rank {rank} {max(errs):.3g}")
        if wrong:
            verdict = "WRONG " + ", ".join(wrong[:4])
        print(f"job {j} world {world} steps {env['JOIN_STEPS']} {time.time() - t0:.1f}s {verdict} cases {','.join(cases)} "
              f"{' '.join(f'{k[9:]}={v}' for k, v in sorted(env.items()) if k.startswith('MACFLEET'))}", flush=True)
        bad += settle(work, verdict, out)
    print(f"done: {jobs} jobs, {bad} bad; kept in {outdir}", flush=True)


if __name__ == "__main__":
    main()
