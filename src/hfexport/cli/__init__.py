"""The `hfexport` command line: `export`, `env`, `patches`."""
