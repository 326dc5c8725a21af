"""libepx.so's CPU references, bound with plain addresses so torch CPU tensors
are read and written in place (tensor.data_ptr(), no numpy copy)."""
from ctypes import POINTER, c_int, c_int32, c_int64, c_void_p

from .._native import fn
from ..dispatch import TokenLayout

__all__ = ["token_layout", "gather_rows", "combine_rows"]
# (epx_dispatch_map_ids is epx.dispatch's binding, _map_ids)

token_layout = fn("epx_token_layout_compute", c_int32, c_void_p, c_int64, c_int32, c_int32,
                  c_int32, POINTER(TokenLayout), c_void_p)
gather_rows = fn("epx_gather_rows", c_int32, c_void_p, c_int, c_int64, c_int64, c_void_p, c_int64,
                 c_int32, c_void_p, c_void_p)
combine_rows = fn("epx_combine_rows", c_int32, c_void_p, c_int, c_int64, c_int64, c_void_p,
                  c_void_p, c_int64, c_int32, c_void_p, c_void_p)
