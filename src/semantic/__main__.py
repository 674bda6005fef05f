"""`python -m semantic` is the `semantic` command."""

import sys

from semantic.cli import main

sys.exit(main())
