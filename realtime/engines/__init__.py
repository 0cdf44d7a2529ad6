"""The server's engines: loading, placement of sessions, admission and restarts."""
