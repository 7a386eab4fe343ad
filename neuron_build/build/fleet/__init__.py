"""The fleet: the build on a Dask cluster (dask_executor, connect, dask_worker), its Slurm workers (clusters,
slurm_wait), and what it schedules by (predict: compile time and memory from the ledger; dispatch: the policy)."""

__all__: list[str] = []
