"""Stand-in package for tools/peer_test.py (tools/peer_shim/_epx_peer.py): the
release's version, as vllm/__init__.py publishes it."""
import _epx_peer

__version__ = _epx_peer.VERSION
