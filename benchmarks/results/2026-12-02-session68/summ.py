import json, sys
for line in open(sys.argv[1]):
    if "CUDA {" not in line:
        continue
    d = json.loads(line[line.index("{"):])
    bad = {k: v for k, v in d.items() if (v is False) or (k.startswith("oracle_max_diff") and not (isinstance(v, float) and v < 1e-5))}
    diffs = [v for k, v in d.items() if k.startswith("oracle_max_diff") and isinstance(v, float)]
    print(f"rank {d['rank']}: {len(d)} keys, not ok: {bad}, max oracle diff {max(diffs):.2e}, wide {d.get('oracle_max_diff_wide')}, {d.get('oracle_max_diff_wide_copies_from_training_thread')}")
