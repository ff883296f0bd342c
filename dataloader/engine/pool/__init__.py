"""The worker pool: child processes that compute units, results back in unit order."""
