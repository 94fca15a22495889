"""The `peerpods` command line: a thin layer that parses, calls, prints and exits.

`main` is the entry point; each subcommand is one module named for it (`serve`, `webhook`,
`select`, `plan`, `cdi`, `catalog`, `node`, `podvm`) with `configure(parser)` and `run(args)`,
imported only when chosen. The rest serve them: `flags` (flags and env twins from the setting
declarations), `settings` (the sections of the commands other than `serve`) and `pod_plan` (the
report `plan` prints, made by the same code a pod goes through).
"""
