"""What writes and opens an export folder: its runtime package (`package.py`)."""
