"""cakeconv's benchmarks: ``python -m benchmarks.<op|model_step|first_step>``, ``torchrun ... -m benchmarks.kcp``
(benchmarks/README.md); timing.py holds the protocol they share, report.py what they write."""
