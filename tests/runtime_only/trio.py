"""Put first on the PYTHONPATH of every process the tests start (tests/conftest.py), so that
those processes import what a deployment has, not the test tools' dependencies.

trio is installed only for selenium (the `dev` extra), and httpcore imports it whenever it is
installed (`httpcore._synchronization`, to pick trio's locks under trio): 0.1 s of CPU at every
start of a worker, a CLI command or `serve`, of some 600 in a run. A deployment has no trio,
and httpcore then uses threading's and anyio's primitives, as here."""

raise ImportError("trio is a dependency of the tests' browser driver, not of examforge")
