"""cakeconv's benchmarks, run from the repository root as ``python -m benchmarks.<op|model_step|first_step>`` and
``torchrun ... -m benchmarks.kcp`` (benchmarks/README.md); timing.py holds the protocol they share, report.py what
they write."""
