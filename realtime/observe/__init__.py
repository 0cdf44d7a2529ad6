"""What the server reports about its work: Prometheus metrics, first-audio traces, loop lag, the error log."""
