"""One sans-I/O module per API dialect: framed stream events in, token events out."""
