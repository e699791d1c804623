"""Unit tests of the build scripts: `make check-build-scripts` (standard library only)."""
