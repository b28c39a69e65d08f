"""The code that runs work: a chapter's paid calls (pipeline), the lease heartbeat (heartbeat),
batch mode's passes (batching) and the broker-less local runner (local).

It sits above `storage` and below `tasks` and `producer`: the domain (`examforge`) knows nothing
of the database, and the store knows nothing of who calls it (pyproject's import-linter
contracts check both).
"""
