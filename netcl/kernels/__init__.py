"""OpenCL C sources, one .cl file per kernel family with shared .h headers; shipped as package data,
built by netcl.runtime (kernel_source inlines the headers)."""
