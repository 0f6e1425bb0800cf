"""What every verb module shares."""

from __future__ import annotations

import argparse
from typing import TypeAlias

EXIT_USAGE = 2
# the `verbs` of `specdec <verb>`, handed to each verb module's register()
Verbs: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
