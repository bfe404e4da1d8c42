"""`localspec chat`: the Textual app (app.py), the conversation it holds (conversation.py), its widgets and
workers; conversations are saved in the history store (localspec/history.py).

Textual is imported only here, so `localspec run` and friends start without it.
"""
