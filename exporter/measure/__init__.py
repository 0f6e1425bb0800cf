"""`specdec measure`: the published per-scenario measurement against any endpoint."""
