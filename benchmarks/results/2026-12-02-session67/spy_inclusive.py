import sys
from collections import Counter
inc=Counter(); n=0; bw=0
pats=sys.argv[2].split(',')
for line in open(sys.argv[1]):
    stack, c = line.rsplit(' ',1); c=int(c); n+=c
    fr=stack.split(';')
    if not any('_engine_run_backward' in f for f in fr): continue
    bw+=c
    seen=set()
    for f in fr:
        name=f.split(' (')[0]
        for p in pats:
            if p in name and p not in seen: seen.add(p); inc[p]+=c
print(n, "samples; backward", bw)
for p in pats: print(inc[p], p)
