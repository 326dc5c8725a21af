/* epx/trace.h - part of the core API; include epx.h, not this file. */
#ifndef EPX_TRACE_H
#define EPX_TRACE_H

#endif /* EPX_TRACE_H */
