"""`python -m voicebias.cli`: the voicebias command."""

import sys

from voicebias.cli import main

if __name__ == "__main__":
    sys.exit(main())
