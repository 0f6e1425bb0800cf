"""`python -m exporter` is the `specdec` command."""

from exporter.cli import main

raise SystemExit(main())
