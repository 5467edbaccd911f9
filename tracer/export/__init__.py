"""Exports of a trace for bug reports: Perfetto (Chrome Trace Event JSON), a self-contained bundle, the recorded
attention call that `replay` and the differential check share. Torch-free."""
