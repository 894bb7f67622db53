"""Model-family workarounds (`models/<family>.py`), kept apart from the backends.

Each module registers patches or fixes for one model family; this package imports them all.
"""
