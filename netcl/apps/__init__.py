"""netcl's applications: the `netcl` command (cli), benchmarks (bench), export verification
(verify) and training recipes (recipes). They build on the library; the library never imports
them (tests/test_layering.py checks)."""
