"""Scripts that run inside other projects' environments (never imported by voicebias itself)."""
