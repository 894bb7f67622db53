"""`python -m hfexport.fuzz`: the fuzzer's command line (`hfexport.fuzz.command.main`)."""

from .command import main

raise SystemExit(main())
