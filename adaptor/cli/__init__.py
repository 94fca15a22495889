"""The `peerpods` command line: a thin layer that parses, calls, prints and exits."""
