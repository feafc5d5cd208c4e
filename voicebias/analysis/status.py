"""The status of each row an analysis returns: whether its estimate or test could be made.

Every table of an estimate or a test (describe, summarize, RQ1, SC, disaggregated) carries two
columns, `status` and `reason`, so a degenerate table gives rows that say what could not be
estimated instead of an exception. `status` is ``ok``, ``separation`` or ``not estimable``;
`reason` is empty for a plain ``ok`` row and otherwise says why, in words. Older status columns
keep their values beside these. :class:`NotEstimable` is what a fitter raises for a table it
cannot estimate.

What each status means, per table: docs/status.md.
"""

from __future__ import annotations

from voicebias.errors import VoicebiasError

OK = "ok"
SEPARATION = "separation"
NOT_ESTIMABLE = "not estimable"
#: the whole vocabulary of the `status` column
STATUSES = (OK, SEPARATION, NOT_ESTIMABLE)
STATUS_COLUMNS = ["status", "reason"]


class NotEstimable(VoicebiasError, ValueError):
    """A fit or test that the data cannot support (non-convergence, a singular design, a
    degenerate outcome): the caller records it as a row with status 'not estimable' and
    this message as its reason. Any other exception is a fault and propagates."""
