"""The control plane: the sidecar's own requests to the upstream (its model listing, its
metrics page, its health) and what it concludes from them; never on a request's path."""
