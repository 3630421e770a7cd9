"""I/O: the client's bytes to the server and the server's back, unchanged; a copy of each
response piece goes to :mod:`sidecar.measure`.

Three folders, each importing only the ones before it: ``server`` (the client-facing HTTP
server's plumbing on aiohttp), ``data`` (the data plane: a request's way to the upstream and
its bytes back) and ``control`` (the sidecar's own requests to the upstream)."""
