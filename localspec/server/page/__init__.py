"""The chat page at `/`: its static files and the conversations API it keeps in the history store."""
