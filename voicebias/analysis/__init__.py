"""Statistics and the analyses of both studies (S2S: RQ1 and RQ2; SC: voice quality, retention, judge scores)."""
