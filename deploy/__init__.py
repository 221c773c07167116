"""Deploy artifacts: one job model (job.py), one renderer/runner per target."""
