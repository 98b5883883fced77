"""The emulated cluster: hosts in network namespaces on this machine, each with its own sshd, and
aarch64 boards under qemu-user in user namespaces of their own.

Shipping code (``autodice.deploy``) never imports this package: it reaches an emulated host
through the inventory :func:`.state.inventory_toml` writes, as it reaches a real board.
"""
