"""Stand-in for sglang.srt.elastic_ep.elastic_ep (tools/peer_shim/_epx_peer.py says what fills it)."""
import _epx_peer

_epx_peer.fill(__name__, globals())
