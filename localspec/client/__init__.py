"""Reaching a running `localspec serve`: `connect` (find it, check it holds the pair, stream an answer), used
by `localspec run`; `remote` (`RemoteSession`, `RemoteEngine`: a session whose pair the server holds), used by
the chat app."""
