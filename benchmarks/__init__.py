"""cakeconv's benchmarks, run from the repository root (benchmarks/README.md has the protocol):

    python -m benchmarks.op            the op on one GPU: GPU time, eager loop, host cost; cakeconv, FLA, Dao
    torchrun ... -m benchmarks.kcp     context parallel: KCP against the rank's local op, per layout
    python -m benchmarks.model_step    real layers' and models' training step (FLA's KDA, mamba_ssm's Mamba2)
    python -m benchmarks.first_step    the first training step from a cold start, per library

timing.py holds the timing protocol they share, report.py what they write.
"""
