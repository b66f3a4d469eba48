"""python -m dgcshim: the `dgcshim` command."""
import sys

from .cli import main

sys.exit(main())
