"""Serving systems outside DVC: the OpenAI-compatible shim around a repository driver
(:mod:`voicebias.serving.shim`, standard library only) and the `voicebias serve` command
(:mod:`voicebias.cli.serve`)."""
