import sys, macfleet
macfleet.init()
n = int(sys.argv[1])
for i in range(n):
    print(f"line {i} " + "x" * 100)
    if i % 20000 == 0:
        macfleet.barrier()
