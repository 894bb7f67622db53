"""What writes and opens an export folder: the runtime's own package (`package.py`), saving
(`bundle.py`, given what a folder holds beside its artifacts: `contents.py`), opening a generation
folder (`generation_export.py`), the manifest read back with suspicion (`manifest.py`), what an
export may write and replace (`output_folder.py`), staged and atomic writes (`storage.py`), and the
tokenizer files it carries (`tokenizer_files.py`)."""
