"""The status of each row an analysis returns: whether its estimate or test could be made.

Every table of an estimate or a test (describe, summarize, RQ1, SC, disaggregated)
carries two columns, `status` and `reason`, so a degenerate table gives rows that say
what could not be estimated instead of an exception:

- ``ok``: the estimate (and its interval or test) was made and is finite;
- ``separation``: the outcome does not vary within a group the estimate contrasts
  (complete or quasi-complete separation, a zero cell, every answer one class), so the
  maximum-likelihood estimate is infinite or undefined; the row carries what can still
  be estimated (the Firth estimate, an exact test) and `reason` says which;
- ``not estimable``: no estimate could be made (no data, an empty cell, a constant
  measure, a rank-deficient design, a fit that did not converge).

`reason` is empty for a plain ``ok`` row and otherwise says why, in words (an ``ok``
row may carry a note, such as a singular mixed-model fit). Older status columns
(describe's `fit_status`, RQ1's `warning`, SC's `converged`, the disaggregated
`ci_method`) keep their values beside these.
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
