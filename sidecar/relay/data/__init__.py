"""The data plane: a client's request to the upstream and the upstream's bytes back,
unchanged and unbuffered, with a copy of each piece handed to :mod:`sidecar.measure`."""
