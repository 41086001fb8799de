"""openwop-memory: the OpenWOP RFC 0004 memory sidecar daemon."""

__version__ = "0.1.0"
