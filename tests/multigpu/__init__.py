"""Multi-GPU tier (tier 5): scripts run by tests/multigpu/run.sh under torchrun (not collected by pytest)."""
