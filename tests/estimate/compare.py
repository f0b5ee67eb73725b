#!/usr/bin/env python3
"""compare.py [--routed] REAL.txt EST_0.txt ... EST_{N-1}.txt [-- LATE_0.txt ... LATE_{N-1}.txt [-- ...]]
- a simulated run (train --estimate-only, one file per rank) against the real run (train under
mpirun, REAL.txt): every rank's peak memory per category (the "peak_memory_bytes rank R:" lines)
within TOL (default 3 %, $DT_EST_TOL) of the real run's, and the real run's traffic lines (rank
0's collectives of the last step, per mesh dim) equal, byte for byte, to the simulated rank 0's.
With LATE files (the same simulation with DTENSOR_SIM_COMPLETE=wait: collectives complete only
when waited for), the timing-dependent figures (communication, total) may lie anywhere between
the two estimates (within TOL of that range): a real rank that lags sees its collectives late.
More "--" groups (EARLY files: DTENSOR_SIM_COMPLETE=now, every collective complete at its first
test, as on a device whose work finishes before each call returns) widen the range the same way.
--routed (expert parallelism: the real run's row counts follow its routing, the simulation takes
the routing as balanced): TOL 25 % and traffic compared by calls only.
Prints the worst relative error per category; exits 1 on any difference."""
import os
import re
import sys


def mem_lines(path):
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"peak_memory_bytes rank (\d+): (.*)$", line.strip())
            if m:
                out[int(m.group(1))] = {k: int(v) for k, v in
                                        (kv.split("=") for kv in m.group(2).split())}
    return out


def traffic(path):
    with open(path) as f:
        return [l.rstrip("\n") for l in f if l.startswith("traffic last step")]


def main():
    args = sys.argv[1:]
    routed = bool(args) and args[0] == "--routed"
    if routed:
        args = args[1:]
    tol = float(os.environ.get("DT_EST_TOL", "0.25" if routed else "0.03"))
    groups = []  # the bound files of each "--" group
    while "--" in args:
        k = len(args) - 1 - args[::-1].index("--")
        groups.insert(0, args[k + 1:])
        args = args[:k]
    real_path, est_paths = args[0], args[1:]
    real = mem_lines(real_path)
    if len(real) != len(est_paths):
        print(f"the real run reports {len(real)} ranks, {len(est_paths)} estimates given")
        return 1
    bad, worst, point = 0, {}, {}
    for r, p in enumerate(est_paths):
        est = mem_lines(p)
        bounds = [mem_lines(g[r]) for g in groups if r < len(g)]
        if r not in est or r not in real:
            print(f"rank {r}: no peak_memory_bytes line ({p})")
            return 1
        for k, v in real[r].items():
            e = est[r].get(k)
            if e is None:
                print(f"rank {r}: {k} missing in the estimate")
                bad = 1
                continue
            pe = abs(e - v) / v if v else (0.0 if e == 0 else 1.0)
            point[k] = max(point.get(k, 0.0), pe)
            lo, hi = e, e
            if k in ("communication", "total"):
                for b in bounds:
                    if r in b and k in b[r]:
                        lo, hi = min(lo, b[r][k]), max(hi, b[r][k])
            e = lo if v < lo else hi if v > hi else v  # the nearest end of the range
            err = abs(e - v) / v if v else (0.0 if e == 0 else 1.0)
            worst[k] = max(worst.get(k, 0.0), err)
            if err > tol:
                print(f"rank {r}: {k} estimated {e} bytes, the run took {v} ({err:.1%})")
                bad = 1
    t_real, t_est = traffic(real_path), traffic(est_paths[0])
    if routed:  # calls only: the bytes of the routed exchanges follow the routing
        t_real = [re.sub(r" \d+ bytes", "", l) for l in t_real]
        t_est = [re.sub(r" \d+ bytes", "", l) for l in t_est]
    if not t_real or t_real != t_est:
        print("traffic differs:\n  run:      " + "\n  run:      ".join(t_real) +
              "\n  estimate: " + "\n  estimate: ".join(t_est))
        bad = 1
    print("worst relative error: " + " ".join(f"{k}={v:.4f}" for k, v in worst.items()) +
          f"; traffic lines {'equal' if t_real == t_est else 'DIFFER'} ({len(t_real)})" +
          "; point estimate: " + " ".join(f"{k}={point[k]:.4f}" for k in ("communication", "total")
                                         if k in point))
    return bad


if __name__ == "__main__":
    sys.exit(main())
