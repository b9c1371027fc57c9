"""KV engines: token ids in, token ids out, with an explicit per-session cache that can be cropped.

Importing the package tunes OpenMP before torch can load libgomp (which reads its environment once, when loaded):
torch's CPU threads busy-wait for each other at every parallel region, 300,000 spins by default. On a machine where
another process holds a core, the thread that lost its core is descheduled while its sibling spins, and a decode step
of the tiny model went from 33 ms to 386-581 ms (two threads on two cores, one busy loop beside them). 10,000 spins
keep the idle speed (33.5 ms) and bound the contended step at ~120 ms; `python -m bench.omp_contention` measures
both side by side. A value the operator set wins."""

import os

OPENMP_SPIN_COUNT = "10000"
os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT)
