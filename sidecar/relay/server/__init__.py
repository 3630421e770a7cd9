"""Server plumbing: the client-facing HTTP server on aiohttp, what it refuses before a
request reaches the proxy, the error answers, and shutdown that loses no request."""
