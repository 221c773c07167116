"""Deploy artifacts from one job model (job.py, plan.py): shared pieces here, and one folder per
target under targets/ holding the target, its internals and its held half, behind one protocol
(targets/base.py)."""
