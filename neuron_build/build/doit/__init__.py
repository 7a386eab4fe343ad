"""The doit glue of a build on this host: the task loader and session (session), doit's run with the project's exit
codes (run, seek), the reporter (report), and the no-op path (noop: the plan cache, the recorded-input check)."""

__all__: list[str] = []
