"""I/O: the client's bytes to the server and the server's back, unchanged; a copy of each
response piece goes to :mod:`sidecar.measure`."""
