"""Stand-in package for tools/peer_test.py (tools/peer_shim/_epx_peer.py)."""
