"""One module per DVC stage, of the stage's name: read the inputs, call the library, validate, write."""
