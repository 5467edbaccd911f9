"""Exports of a trace for bug reports: Perfetto (Chrome Trace Event JSON), a self-contained bundle, `--steps`
ranges. Torch-free; the top layer of the tracer core (they read through the reader and run the checks)."""
