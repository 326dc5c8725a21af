"""Stand-in for vllm.config.parallel (tools/peer_shim/_epx_peer.py says what fills it)."""
import _epx_peer

_epx_peer.fill(__name__, globals())
