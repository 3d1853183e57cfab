"""fcap: tcpdump for any point inside the Linux network stack."""

from .errors import FcapError

__version__ = "0.1.0"
__all__ = ["FcapError", "__version__"]
