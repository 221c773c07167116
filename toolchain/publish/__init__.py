"""Sending an image to a registry: its blobs compressed once into the user's cache (blobs,
layer_sources), pushed with a manifest per tag (push), and the local registry this tool can run
(local_registry)."""
