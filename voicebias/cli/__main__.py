"""`python -m voicebias.cli`: the voicebias command."""

import sys

from voicebias.cli import main

sys.exit(main())
