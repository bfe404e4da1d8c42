"""`localspec chat`: the Textual app (app.py), its widgets, and the SQLite history (history.py).

Textual is imported only here, so `localspec run` and friends start without it.
"""
