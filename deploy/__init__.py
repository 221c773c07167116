"""Deploy artifacts from one job model (job.py): one module per target under targets/, behind one
protocol (targets/base.py); shared renderers (sbatch.py), the enroot converter (enroot.py) and
all-or-nothing writes (artifacts.py)."""
