"""Gates that stop the pipeline: the carrier gate (inputs) and the phonation manipulation check."""
