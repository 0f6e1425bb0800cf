"""What a verb of `specdec` is, for the command line and the packages that add verbs to it
(the `specdec.verbs` entry point): a module whose `register(add_verb)` adds its parser with a
`run(args) -> int`, and the exit statuses every verb shares."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
# what each verb module's register() gets: the `add_parser` of `specdec <verb>`'s subparsers
AddVerb: TypeAlias = Callable[..., argparse.ArgumentParser]
