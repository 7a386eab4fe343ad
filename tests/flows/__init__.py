"""Feature trials: the CLI (and doit) as users run them, end to end, across packages."""
