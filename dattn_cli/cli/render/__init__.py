"""Renderers: library results in, rich tables out (stdout); progress and notes to stderr. No measurement
happens here. One module per command; common.py holds the consoles and number formats."""
