"""In-image runtime: cluster spec access, Ray bootstrap and worker-group training."""
__version__ = "0.1.0"
