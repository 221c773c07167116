"""Build-side toolchain: offline base bootstrap, layered image builds, registry push."""
__version__ = "0.1.0"
