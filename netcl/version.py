"""netcl's version: one place, read by the package, the exporter (producer_version) and .netcl files."""
__version__ = "0.2.0"
