"""Driver scripts run inside each repository's own environment (never imported by voicebias).

Each script loads one model with its repository's documented API and answers JSON
requests line by line (see :mod:`voicebias.systems.repository`). They use only the
standard library and numpy from this folder (_protocol.py); everything else comes
from the checkout and its environment.
"""
