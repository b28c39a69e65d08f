"""examforge's benchmark suite: every figure a ratio against a baseline measured in the same run.

Run from the repository root (bench is not an installed package):

    python -m bench [--small] [--only part1,part2] [--results bench/results.md]

Modules, one concept each: `measure` (process CPU and memory, the mock probe, the database
probe, waits), `systems/` (one module per system under test), `parts/` (one module per row of
issue 8's table), `report` (the markdown and JSON), `plots` (the PNGs), `suite` (the command).
`throughput.py`, `ratelimit.py` and `store_cost.py` stay runnable on their own.
"""
