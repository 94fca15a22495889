"""TOML written by us: whole documents out (`write`) and surgical edits of someone else's file
(`edit`), shared by the node installer (containerd's and Kata's files) and the pod VM's CDH
configuration, so it sits below both."""
