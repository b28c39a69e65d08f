"""The parts of `python -m bench`, one module per row (or group of rows) of issue 8's table.

Each module has `NAME`, a one-line `TITLE` and `run(ctx) -> PartResult` (see bench.suite)."""
